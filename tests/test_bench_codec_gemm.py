"""perf/bench_codec_gemm.py runs end to end on the CPU (one tiny shape, the torch reference in
both columns); the H200 numbers come from the same script at the codec's shapes."""

from __future__ import annotations

import json

from moss_tts.kernels import fused_linear as fl
from perf.bench_codec_gemm import OPS, best_table, format_table, main


def test_a_tiny_cpu_run_reports_every_gemm_and_a_table(tmp_path):
    out = tmp_path / "gemm.json"
    assert main(["--device", "cpu", "--tiny", "--reps", "1", "--iters", "1", "--sweep", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [(r["op"], r["rows"]) for r in results["rows"]] == [(op, rows) for op in OPS for rows in (2, 37)]
    assert all(r["torch_ms"] > 0 and r["fused_ms"] > 0 and r["rel_diff"] < 1e-5 for r in results["rows"])
    assert set(results["table"]) == {"norm", "plain"}
    namespace = {"GemmConfig": fl.GemmConfig}
    exec(format_table(results["table"]), namespace)
    assert all(isinstance(config, fl.GemmConfig) for entries in namespace["CONFIG_TABLE"].values()
               for _, config in entries)


def test_the_printed_table_is_config_table_source():
    # 128x128 wins at 2 and 64 rows, 64x64 at 640: two entries, the last open-ended
    sweeps = [{"kind": "norm", "rows": rows, "ms": {"64x64x64 w4 s4 g8": 1.0, "128x128x64 w8 s3 g8": ms}}
              for rows, ms in ((2, 0.5), (64, 0.5), (640, 2.0))]
    namespace = {"GemmConfig": fl.GemmConfig}
    exec(format_table(best_table(sweeps)), namespace)
    assert namespace["CONFIG_TABLE"] == {"norm": ((64, fl.GemmConfig(128, 128, 64, 8, 3)),
                                                  (2**62, fl.GemmConfig(64, 64, 64, 4, 4)))}


def test_a_sweep_of_few_rows_replaces_only_those_rows_of_the_table():
    """bench_vocoder.py --gemm-table: the sweep's tiles up to the most rows it swept (its last entry
    capped there, split-K candidates included), the table's own above."""
    from perf.bench_codec_gemm import SWEEP_TINY, table_with_sweep
    split = next(c for c in SWEEP_TINY if c.split_k > 1)
    results = {"sweep": [{"rows": 2}, {"rows": 16}],
               "table": {"plain": [(2, str(SWEEP_TINY[0])), (2**62, str(split))], "norm": [(2**62, str(SWEEP_TINY[1]))]}}
    table = table_with_sweep(results)
    assert table["plain"][:2] == ((2, SWEEP_TINY[0]), (16, split))
    assert table["norm"][0] == (16, SWEEP_TINY[1])
    for kind in ("plain", "norm"):
        assert [entry for entry in table[kind] if entry[0] > 16] == [e for e in fl.CONFIG_TABLE[kind] if e[0] > 16]
    assert "split_k=" in format_table({"plain": [(2**62, str(split))]})
