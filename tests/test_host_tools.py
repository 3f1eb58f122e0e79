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
