"""perf/served_budget.py: the GPU budget per frame from the server's sampled counters."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from perf.served_budget import budget, main, read_series, timeline

ROOT = Path(__file__).resolve().parents[1]


def series_text(samples: list[dict]) -> str:
    """In h200_scaling.sh's sample_metrics format (labels already folded into '<family> <stat>')."""
    lines = []
    for s in samples:
        lines.append(f"t {s['t']}")
        lines += [f"moss_engine {k} {v}" for k, v in s.get("engine", {}).items()]
        lines += [f"moss_tts_vocoder {k} {v}" for k, v in s.get("vocoder", {}).items()]
        lines.append('moss_heartbeat_total{model="vocoder",model_instance="vocoder_0_0"} 7')  # other series: skipped
    return "\n".join(lines) + "\n"


def sample(t, running, steps, host, wait, frames, rounds, decoded, round_ms):
    return {"t": t, "engine": {"running": running, "steps": steps, "step_host_ms": host, "step_wait_ms": wait,
                               "frames_generated": frames},
            "vocoder": {"rounds": rounds, "frames": decoded, "round_ms": round_ms}}


SAMPLES = [
    sample(0.0, 0, 0, 0, 0, 0, 0, 0, 0),
    sample(0.5, 256, 10, 50, 100, 2560, 2, 600, 60),     # (0 -> 256 running: left out)
    sample(1.0, 256, 30, 150, 300, 7680, 6, 1800, 180),  # in: 20 steps, 5,120 frames, 4 rounds
    sample(1.5, 250, 50, 250, 500, 12800, 10, 3000, 300),  # in: 20 steps, 5,120 frames, 4 rounds
    sample(2.0, 40, 60, 300, 560, 13200, 12, 3600, 360),  # (250 -> 40: left out)
]


def test_budget_sums_only_intervals_inside_the_rows(tmp_path):
    path = tmp_path / "metrics_series_single.txt"
    path.write_text(series_text(SAMPLES))
    got = budget(read_series(path), (200, 300))
    assert got["intervals"] == 2 and got["seconds"] == pytest.approx(1.0)
    assert got["steps"] == 40 and got["host_ms_per_step"] == pytest.approx(5.0)
    assert got["wait_ms_per_step"] == pytest.approx(10.0) and got["rows_per_step"] == pytest.approx(256)
    assert got["engine_us_per_frame"] == pytest.approx(600 * 1e3 / 10240)
    assert got["frames_per_round"] == pytest.approx(300) and got["ms_per_round"] == pytest.approx(30)
    assert got["vocoder_us_per_frame"] == pytest.approx(100) and got["vocoder_busy"] == pytest.approx(0.24)


def test_gzip_series_and_the_cli(tmp_path, capsys):
    path = tmp_path / "metrics_series_x.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(series_text(SAMPLES))
    out = tmp_path / "budget.json"
    assert main([str(path), "--rows", "200-300", "--out", str(out)]) == 0
    assert json.loads(out.read_text())[str(path)]["steps"] == 40
    assert "| 5.00 | 10.00 | 256 | 300 | 30.0 | 100 | 24% |" in capsys.readouterr().out
    assert main([str(path), "--rows", "500-600"]) == 1  # no interval inside: nothing measured


def test_instances_are_summed_and_a_sample_cut_short_is_left_out(tmp_path):
    # Two engine instances (the sampler drops the instance label): their lines add up.
    lines = []
    for line in series_text(SAMPLES[:4]).splitlines():
        lines.append(line)
        if line.startswith("moss_engine step_host_ms"):
            lines.append(line)  # a second instance with the same host time
    cut = {"t": 2.0, "engine": {"running": 256, "steps": 90}}  # the last sample lost its other lines
    path = tmp_path / "metrics_series_two.txt"
    path.write_text("\n".join(lines) + "\n" + series_text([cut]))
    got = budget(read_series(path), (200, 300))
    assert got["intervals"] == 2 and got["steps"] == 40
    assert got["host_ms_per_step"] == pytest.approx(10.0)  # 2 x 5 ms: summed, not overwritten


def test_the_committed_series_give_perf_results_figures():
    """perf/RESULTS.md's budget table (issue 34, second round) comes from these files."""
    table = {"a770d3f-call5": (6.77, 11.41, 329, 100), "ln_lt_gelu-call4": (6.49, 17.09, 330, 101),
             "none-call4": (6.11, 17.74, 368, 110)}
    for name, (host, wait, frames, us) in table.items():
        got = budget(read_series(ROOT / f"perf/results/issue34/r2-metrics-series-{name}.txt.gz"), (200, 300))
        assert (round(got["host_ms_per_step"], 2), round(got["wait_ms_per_step"], 2)) == (host, wait), name
        assert (round(got["frames_per_round"]), round(got["vocoder_us_per_frame"])) == (frames, us), name


def test_timeline_splits_each_intervals_host_time(tmp_path, capsys):
    samples = [dict(s) for s in SAMPLES[:3]]
    samples[1] = {**samples[1], "engine": {**samples[1]["engine"], "step_launch_ms": 20, "step_apply_ms": 10,
                                           "requests_admitted": 256}}
    samples[2] = {**samples[2], "engine": {**samples[2]["engine"], "step_launch_ms": 80, "step_apply_ms": 30,
                                           "requests_admitted": 300}}
    path = tmp_path / "metrics_series_t.txt"
    path.write_text(series_text(samples))
    rows = timeline(read_series(path))
    assert [r["t"] for r in rows] == [0.5, 1.0]
    second = rows[1]  # 20 steps: host 100 ms = launch 60 + apply 20 + the rest 20
    assert second["admitted"] == 44 and second["engine_fps"] == pytest.approx(5120 / 0.5)
    assert (second["host_ms"], second["launch_ms"], second["apply_ms"]) == pytest.approx((5.0, 3.0, 1.0))
    assert second["rest_ms"] == pytest.approx(1.0) and second["frames_per_round"] == pytest.approx(300)
    assert main([str(path), "--timeline"]) == 0 and "launch" in capsys.readouterr().out


def test_steal_bands_group_the_windows_by_the_cores_stolen(tmp_path, capsys):
    """Three 10 s windows after the 20 s skip: two without steal (10 steps of 5 ms host each), one
    with 1 core stolen (10 steps of 15 ms host): each band gets its own windows' rates only."""
    from perf.served_budget import steal_bands

    def eng(t, steps, host, frames):
        return {"t": t, "engine.steps": steps, "engine.step_host_ms": host, "engine.step_wait_ms": steps * 10.0,
                "engine.frames_generated": frames, "vocoder.frames": frames * 0.8}

    samples = [eng(0.0, 0, 0, 0), eng(20.0, 100, 500, 25600),
               eng(25.0, 105, 525, 26880), eng(29.9, 110, 550, 28160),    # window 20-30: no steal
               eng(30.0, 110, 550, 28160), eng(39.9, 120, 700, 30720),    # window 30-40: stolen
               eng(40.0, 120, 700, 30720), eng(49.9, 130, 750, 33280),    # window 40-50: no steal
               eng(50.0, 130, 750, 33280)]
    cpu = [{"t": 30.0, "steal": 0.0}, {"t": 40.0, "steal": 1.0}, {"t": 50.0, "steal": 0.02}]
    bands = steal_bands(samples, cpu)
    assert [b["steal_band"][0] for b in bands] == [0.0, 0.3]
    calm, stolen = bands
    assert calm["windows"] == 2 and calm["host_ms_per_step"] == pytest.approx(5.0)
    assert calm["steal_cores"] == pytest.approx(0.01)
    assert stolen["windows"] == 1 and stolen["host_ms_per_step"] == pytest.approx(15.0)
    assert stolen["engine_fps"] == pytest.approx(2560 / 9.9)
    # The CLI takes one CPU series per metric series, and refuses a count that does not match.
    path, cpu_path = tmp_path / "metrics_series_soak_load.txt", tmp_path / "cpu_series_soak.txt"
    path.write_text(series_text(SAMPLES))
    cpu_path.write_text("".join(json.dumps({**c, "busy": 3.0, "iowait": 0.0, "groups": {}}) + "\n" for c in cpu))
    assert main([str(path), "--cpu", str(cpu_path)]) == 0
    assert "by the cores stolen" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(path), str(path), "--cpu", str(cpu_path)])
