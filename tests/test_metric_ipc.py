"""The stub's metric calls (serving/metrics.py) under a stand-in for Triton's pb_utils: every set,
increment or observe is an IPC round trip made holding the GIL, so an unchanged series is not sent
again and the per-request counters move once per flush by their sums (issue 34, round 15: the
gauge threads held the GIL 4-6x as long as 64 streams' threads on the dev box's server). What
Prometheus reads is unchanged: test_metrics.py checks the real server's series."""

from __future__ import annotations

import importlib
import sys
import threading
import time
import types

import pytest


class FakeMetric:
    def __init__(self, calls: list, name: str) -> None:
        self.calls, self.name, self.value = calls, name, 0.0

    def set(self, value) -> None:
        self.calls.append(("set", self.name, value))
        self.value = value

    def increment(self, value) -> None:
        self.calls.append(("increment", self.name, value))
        self.value += value

    def observe(self, value) -> None:
        self.calls.append(("observe", self.name, value))


@pytest.fixture()
def metrics(monkeypatch):
    """moss_tts.serving.metrics imported against a pb_utils whose metrics record their calls."""
    lock = threading.Lock()

    class Recorder(list):
        def append(self, item) -> None:  # the gauge thread and the test both touch it
            with lock:
                super().append(item)

        def snapshot(self) -> list:
            with lock:
                return list(self)

    calls = Recorder()

    class Family:
        GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"

        def __init__(self, name, description, kind) -> None:
            self.name = name

        def Metric(self, labels=None, buckets=None):  # noqa: N802 (pb_utils' name)
            return FakeMetric(calls, f"{self.name}{sorted((labels or {}).items())}")

    fake = types.ModuleType("triton_python_backend_utils")
    fake.MetricFamily = Family
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "moss_tts.serving.metrics", raising=False)
    module = importlib.import_module("moss_tts.serving.metrics")
    module.calls = calls
    yield module
    module.release_metrics()
    sys.modules.pop("moss_tts.serving.metrics", None)


def test_a_histogram_sends_only_the_series_that_moved(metrics):
    histogram = metrics.HistogramGauges("h", "a histogram", (1, 2, 4))
    histogram.set(((0, 1, 1, 1), 1.5, 1))
    assert len(metrics.calls.snapshot()) == 4 + 2  # the first publication sends every series
    del metrics.calls[:]
    histogram.set(((0, 1, 1, 1), 1.5, 1))
    assert metrics.calls.snapshot() == []
    histogram.set(((0, 1, 2, 2), 4.5, 2))  # a value of 3: le=4, +Inf, sum and count move
    assert [name.split("[")[0] for _, name, _ in metrics.calls.snapshot()] == ["h_bucket"] * 2 + ["h_sum", "h_count"]


def test_gauges_refresh_only_the_stats_that_changed(metrics):
    values, lock = {"a": 1, "b": 2}, threading.Lock()  # read by the gauge thread

    def read() -> dict:
        with lock:
            return dict(values)

    gauges = metrics.Gauges("g", "gauges", ("a", "b"), read, interval_s=0.01)
    deadline = time.monotonic() + 5
    while len(metrics.calls.snapshot()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # ~10 refreshes of unchanged values
    assert len(metrics.calls.snapshot()) == 2
    with lock:
        values["b"] = 3
    while len(metrics.calls.snapshot()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    gauges.stop()
    assert [(kind, name.split("[")[1], value) for kind, name, value in metrics.calls.snapshot()][2:] == [
        ("set", "('stat', 'b')]", 3)]


def test_request_counters_move_once_per_flush_by_their_sums(metrics):
    requests = metrics.RequestMetrics()
    record = types.SimpleNamespace(outcome="ok", first_output_s=0.02, rtf=0.2, audio_s=1.5)
    for _ in range(3):
        requests.observe(record)
    requests.count("invalid")
    requests.flush()
    calls = [(kind, name.split("[")[0], value) for kind, name, value in metrics.calls.snapshot()]
    assert sorted(c for c in calls if c[0] == "increment") == [
        ("increment", "moss_tts_audio_seconds_total", 4.5), ("increment", "moss_tts_requests_total", 1),
        ("increment", "moss_tts_requests_total", 3)]
    observed = sorted(c[1] for c in calls if c[0] == "observe")  # still one call per value
    assert observed == ["moss_tts_rtf"] * 3 + ["moss_tts_time_to_first_audio_seconds"] * 3
    del metrics.calls[:]
    requests.flush()
    assert metrics.calls.snapshot() == []


def test_counters_that_did_not_move_send_nothing(metrics):
    counters = metrics.Counters("c", "counters", ("hit", "miss"), label="event")
    counters.publish({"hit": 2, "miss": 0})
    assert [(kind, value) for kind, _, value in metrics.calls.snapshot()] == [("increment", 2)]
    counters.publish({"hit": 2, "miss": 0})
    assert len(metrics.calls.snapshot()) == 1
