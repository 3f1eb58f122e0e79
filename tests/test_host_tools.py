"""perf/host_probe.py and perf/cpu_sample.py: what kind of host a device machine is, and where its
CPU goes under load (issue 34, round 11)."""

from __future__ import annotations

import json
import os

from perf import cpu_sample, host_probe


def test_host_probe_measures_a_wake_up_and_a_gil_regain():
    facts = host_probe.cpu_facts()
    assert facts["cores"] >= 1 and 1 <= facts["usable"] <= facts["cores"]
    assert host_probe.event_us(rounds=50) > 0
    regain = host_probe.regain_us(1, samples=50)
    assert 0 < regain["p50"] <= regain["p90"]


def test_cpu_sample_ticks_and_groups():
    ticks = cpu_sample.machine_ticks()
    assert set(ticks) == {"busy", "idle", "iowait", "steal"} and ticks["busy"] > 0
    assert str(os.getpid()) in cpu_sample.process_ticks()
    assert cpu_sample.group_of(str(os.getpid())) in ("clients", "other")
    assert cpu_sample.group_of("999999999") == ""  # gone: no group, never counted


def test_cpu_summary_means_after_the_skip(tmp_path):
    rows = [{"t": 100.0, "busy": 9.0, "steal": 3.0, "iowait": 0.0, "groups": {"moss_tts": 5.0}},
            {"t": 105.0, "busy": 3.0, "steal": 0.0, "iowait": 0.0, "groups": {"moss_tts": 2.0, "clients": 1.0}},
            {"t": 110.0, "busy": 5.0, "steal": 1.0, "iowait": 0.0, "groups": {"moss_tts": 2.0}}]
    path = tmp_path / "cpu_series.txt"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = cpu_sample.summary(str(path), skip=5)
    assert got["samples"] == 2 and got["busy"] == 4.0 and got["steal"] == 0.5
    assert got["groups"] == {"moss_tts": 2.0, "clients": 0.5}


def test_the_stream_host_bench_measures_its_three_costs(tiny_dir):
    """perf/bench_stream_host.py (issue 34, round 16): tokenization leaves the GIL to other threads
    with encode_batch (PromptBuilder's call) and not with encode; a VocodeJob's life is timed; a
    112-frame stream asks about a cancel fewer times at the served interval than at every chunk."""
    from perf import bench_stream_host as b

    rows = {(r["text"], r["call"]): r for r in b.tokenize(tiny_dir / "model" / "tokenizer.json", 0.2)}
    long_text = [r for (text, _), r in rows.items() if text == "400 chars"]
    by_call = {r["call"]: r["share_left_to_other_threads"] for r in long_text}
    assert by_call["encode_batch"] > by_call["encode"], rows
    assert b.vocode_job(200)["us_per_job"] > 0
    checks = b.cancel_checks(0.005)["checks_per_request"]
    assert list(checks.values())[0] == len(b.SCHEDULE) > list(checks.values())[1] >= 1, checks


def test_the_wave_bench_runs_every_stream_to_its_final(tiny_dir):
    """perf/bench_wave.py: a small wave through the real stream side (SpeechStream, EngineCodes,
    the worker) over the modelled engine and codec; every stream ends with its one final response
    and all its audio."""
    from perf import bench_wave as b

    result = b.main(["--streams", "8", "--frames", "30", "--reps", "1", "--device-ms", "2", "--apply-ms", "0.2",
                     "--wave-steps", "5", "--checkpoint", str(tiny_dir / "model")])
    run = result["runs"][0]
    assert run["streams_ok"] == 8 and run["steps"] >= 30, run
    assert run["first_audio_ms_p50"] > 0 and run["wave_give_ms_per_step"] >= 0, run
