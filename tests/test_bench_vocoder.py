"""perf/bench_vocoder.py runs end to end on the CPU (tiny codec, uncaptured padded step); the
H200 numbers come from the same script on the real-size codec."""

from __future__ import annotations

import json

from perf.bench_vocoder import main


def test_a_tiny_cpu_run_reports_every_section(tmp_path):
    out = tmp_path / "vocoder.json"
    code = main(["--device", "cpu", "--tiny", "--shapes", "1x2,3x4", "--offline", "1x4", "--iters", "1",
                 "--warmup", "0", "--rounds", "3", "--fidelity", "2x6", "--out", str(out)])
    results = json.loads(out.read_text())
    assert code == 0 and results["errors"] == {}
    assert [(r["rows"], r["frames"]) for r in results["step"]] == [(1, 2), (3, 4)]
    assert all(e["graphed_equals_padded"] and e["finite"] for e in results["equivalence"])
    assert results["offline"]["audio_s_per_s"] > 0
    (round_,) = results["rounds"]  # 3 rows of 1..10 frames: one packed step vs one per length
    assert round_["rows"] == 3 and round_["packed_ms"] > 0 and round_["per_length_ms"] > 0
    streamed = results["streaming"]  # 3 rows (the largest bucket), fp32: rounding only
    assert streamed["rows"] == 3 and streamed["finite"] and streamed["max_rel_diff"] < 1e-5
    # The tiny codec is fp32 and on the CPU no fusion runs: the served form differs from the
    # reference only in rounding (LayerScale folded into the weights, the quantizer's weight norm
    # computed once).
    fidelity = results["fidelity"]
    assert (fidelity["rows"], fidelity["frames"]) == (2, 6) and fidelity["max_rel_diff"] < 1e-5
    assert fidelity["snr_db_min"] > 80 and results["meta"]["fusion_running"] == ["none"]
    # The served ring kernel, and on the CPU the torch reference runs whichever is asked
    assert (results["meta"]["ring_kernel"], results["meta"]["ring_kernel_running"]) == ("split", ["split"])


def test_the_ring_kernel_flag_reaches_the_codec(tmp_path):
    out = tmp_path / "vocoder.json"
    code = main(["--device", "cpu", "--tiny", "--shapes", "1x2", "--skip", "capture,streaming,rounds,offline",
                 "--iters", "1", "--warmup", "0", "--ring-kernel", "fused", "--out", str(out)])
    results = json.loads(out.read_text())
    assert code == 0 and results["errors"] == {}
    assert (results["meta"]["ring_kernel"], results["meta"]["ring_kernel_running"]) == ("fused", ["split"])


def test_fp8_rings_run_every_step_and_their_cost_is_measured(tmp_path):
    out = tmp_path / "vocoder.json"
    code = main(["--device", "cpu", "--tiny", "--shapes", "1x2", "--skip", "capture,rounds,offline",
                 "--iters", "1", "--warmup", "0", "--ring-dtype", "fp8_e4m3", "--ring-fidelity", "2x12",
                 "--out", str(out)])
    results = json.loads(out.read_text())
    assert code == 0 and results["errors"] == {} and results["meta"]["ring_dtype"] == "fp8_e4m3"
    ring = results["ring_fidelity"]
    # the streamed audio moves (the rings are read), a little
    assert ring["ring_dtype"] == "fp8_e4m3" and 0 < ring["max_rel_diff"] and 30 < ring["snr_db_min"] < 200, ring
