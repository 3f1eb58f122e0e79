"""perf/bench_kv_fidelity.py runs end to end on the CPU (the tiny model in fp32, every path the torch
one); the figures that count come from the same script on a GPU (perf/RESULTS.md, issue 34 round 25)."""

from __future__ import annotations

import json

from perf.bench_kv_fidelity import main


def test_a_tiny_cpu_run_measures_both_caches_against_fp32(tmp_path):
    out = tmp_path / "fidelity.json"
    assert main(["--tiny", "--count", "2", "--prompt-rows", "30", "--steps", "12", "--frames", "3",
                 "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    exact, fp8 = results["auto"], results["fp8_e4m3"]
    # On the CPU the fp32 model's own cache is the reference itself: no error, every code equal
    assert exact["hidden"]["rel_err"] == 0.0 and exact["frame0_codes_equal"] == exact["frame0_codes"] == 24
    assert exact["leading_frames_equal"] == [3, 3]
    # the fp8 cache is written and read back: the hidden states move, a little
    assert 0.0 < fp8["hidden"]["rel_err"] < 0.2 and len(fp8["hidden"]["rel_err_by_step"]) == 1 + 3
