"""serving/gpu_trace.py (the stub's on-request GPU trace) and perf/gpu_trace_budget.py (its budget),
without a GPU: the watcher on a fake recorder and on the real one (which a CPU refuses), the budget
on a hand-made trace whose busy, idle, overlap, steps and gaps are known."""

from __future__ import annotations

import gzip
import json
import threading
import time

import pytest

from moss_tts.serving.gpu_trace import ENV, GpuTrace, Stopped, parse_request, record_cuda
from perf.gpu_trace_budget import budget, load_events, main

TIMEOUT_S = 30.0


def wait_for(predicate, timeout=TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def ask(directory, text):
    """A request written whole (a rename), as the watcher must never read it half-written."""
    (directory / "request.tmp").write_text(text)
    (directory / "request.tmp").rename(directory / "request")


def test_parse_request():
    assert parse_request("", "d") == (2.0, "d")
    assert parse_request(" 0.5\n", "d") == (0.5, "d")
    assert parse_request("1 soak_35s", "d") == (1.0, "soak_35s")
    for bad, why in (("0", "0.1-30"), ("31", "0.1-30"), ("1 ../x", "letters"), ("1 a b", "SECONDS")):
        with pytest.raises(ValueError, match=why):
            parse_request(bad, "d")
    with pytest.raises(ValueError):
        parse_request("two", "d")


def test_off_without_the_environment_or_a_usable_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    trace = GpuTrace.from_env()
    assert trace.thread is None and trace.directory is None
    trace.stop()  # nothing to stop
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(ENV, str(tmp_path / "file" / "traces"))  # cannot be made: off, not a load failure
    assert GpuTrace.from_env().thread is None


class FakeRecorder:
    """Writes a one-kernel trace after `seconds` of the watcher's own wait (so stop() cuts it)."""

    def __init__(self, fail=False):
        self.lock = threading.Lock()  # calls are appended on the watcher's thread, read on the test's
        self.calls, self.fail, self.started = [], fail, threading.Event()

    def __call__(self, seconds, path, wait):
        with self.lock:
            self.calls.append(seconds)
        path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 5}]}))
        self.started.set()
        if wait(seconds):
            raise Stopped()
        if self.fail:
            raise RuntimeError("no CUPTI")

    def seconds(self):
        with self.lock:
            return list(self.calls)


def test_requests_are_taken_recorded_and_answered_in_turn(tmp_path):
    recorder = FakeRecorder()
    trace = GpuTrace(tmp_path, poll_s=0.01, record=recorder)
    try:
        ask(tmp_path, "0.3 first")
        assert recorder.started.wait(TIMEOUT_S)
        ask(tmp_path, "0.1 second")  # while the first records: it waits its turn, it is not lost
        assert wait_for(lambda: (tmp_path / "second.json.gz").exists())
        with gzip.open(tmp_path / "first.json.gz", "rt") as f:
            assert json.load(f)["traceEvents"][0]["name"] == "k"
        assert recorder.seconds() == [0.3, 0.1]
        assert {p.name for p in tmp_path.iterdir()} == {"first.json.gz", "second.json.gz"}  # nothing half-written
        ask(tmp_path, "99 bad")  # out of range: answered, and the watcher goes on
        assert wait_for(lambda: (tmp_path / "bad.error").exists())
        assert "0.1-30" in (tmp_path / "bad.error").read_text()
        ask(tmp_path, "")
        assert wait_for(lambda: any(p.name.startswith("trace-") and p.name.endswith(".json.gz") for p in tmp_path.iterdir()))
    finally:
        trace.stop()
    assert not trace.thread.is_alive()


def test_a_failed_recording_leaves_only_its_error(tmp_path):
    trace = GpuTrace(tmp_path, poll_s=0.01, record=FakeRecorder(fail=True))
    try:
        ask(tmp_path, "0.1 t")
        assert wait_for(lambda: (tmp_path / "t.error").exists())
        assert wait_for(lambda: {p.name for p in tmp_path.iterdir()} == {"t.error"})
        assert "no CUPTI" in (tmp_path / "t.error").read_text()
    finally:
        trace.stop()


def test_stop_ends_a_recording_at_once_unwritten(tmp_path):
    recorder = FakeRecorder()
    trace = GpuTrace(tmp_path, poll_s=0.01, record=recorder)
    ask(tmp_path, "30 long")
    assert recorder.started.wait(TIMEOUT_S)
    started = time.monotonic()
    trace.stop(timeout=TIMEOUT_S)
    assert not trace.thread.is_alive() and time.monotonic() - started < 10  # not the 30 s asked for
    assert {p.name for p in tmp_path.iterdir()} == set()


def test_the_real_recorder_fails_cleanly_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the CPU's refusal is what this checks")
    trace = GpuTrace(tmp_path, poll_s=0.01, record=record_cuda)
    try:
        ask(tmp_path, "0.1 cpu")
        assert wait_for(lambda: (tmp_path / "cpu.error").exists())
        assert not (tmp_path / "request").exists()
    finally:
        trace.stop()


def kernel(stream, ts, dur, name="gemm"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_budget_of_a_known_timeline(tmp_path):
    # Engine (stream 7): two decode steps of a one-layer backbone: [0, 1000) [1000, 1100) then,
    # after a 2 ms gap, [3100, 4000) [4000, 4100). Codec (stream 9): [500, 3500). A CPU op is ignored.
    events = [kernel(7, 0, 1000, "_decode_qkv_kernel"), kernel(7, 1000, 100, "_draw_kernel"),
              kernel(7, 3100, 900, "_decode_qkv_kernel"), kernel(7, 4000, 100, "_draw_kernel"),
              kernel(7, 4100, 0, "_local_attention_kernel"),  # the engine's, whatever its name ends with
              kernel(9, 500, 3000, "_attention_kernel"),
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99999}]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    result = budget(load_events(path), layers=1)
    assert result["events"] == 6
    assert result["window_ms"] == 4.1
    assert result["gpu_busy_ms"] == 4.1 and result["gpu_idle_ms"] == 0.0
    assert result["two_or_more_streams_ms"] == pytest.approx(1.0)  # [500, 1100) and [3100, 3500)
    engine, codec = result["streams"]  # the most time first: the engine's 2.1 ms, the codec's 3.0
    engine, codec = (engine, codec) if engine["stream"] == 7 else (codec, engine)
    assert (engine["label"], codec["label"]) == ("engine", "codec")
    assert engine["busy_ms"] == 2.1 and codec["busy_ms"] == 3.0
    assert engine["decode_steps"] == 2.0 and engine["ms_per_step"] == 2.05 and engine["busy_ms_per_step"] == 1.05
    assert engine["gaps"] == {"count": 1, "total_ms": 2.0, "p50_ms": 2.0, "p90_ms": 2.0, "max_ms": 2.0,
                              "over_1ms": 1, "over_1ms_total": 2.0}
    assert "gaps" not in codec
    out = tmp_path / "b.json"
    assert main([str(path), "--out", str(out), "--layers", "1"]) == 0
    assert json.loads(out.read_text())["gpu_busy_ms"] == 4.1


def test_prefill_launches_of_a_known_timeline():
    """A two-layer backbone: one whole prefill launch (attention kernels at 100 and 400, a GEMM
    between them and one after the span), then half a launch at the window's edge (left out)."""
    events = [kernel(7, 0, 100, "nvjet_qkv"), kernel(7, 100, 50, "fmha_cutlassF_x"), kernel(7, 150, 250, "nvjet_mlp"),
              kernel(7, 400, 100, "_prefill_kernel"), kernel(7, 500, 30, "_decode_qkv_kernel"),
              kernel(7, 900, 40, "fmha_cutlassF_x"), kernel(7, 940, 10, "_draw_kernel")]
    engine = budget(events, layers=2)["streams"][0]
    p = engine["prefill"]
    assert (p["launches"], p["span_ms_p50"], p["kernel_ms_p50"], p["kernel_ms"]) == (1, 0.4, 0.4, 0.4)
    assert p["share_of_busy"] == round(0.4 / 0.58, 4)
    assert p["top"][0] == {"name": "nvjet_mlp", "ms": 0.25}
    assert "prefill" not in budget([kernel(7, 0, 10, "_decode_qkv_kernel")], layers=1)["streams"][0]


def test_budget_of_an_empty_trace_says_so(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": []}))
    assert main([str(path)]) == 1
    assert "no GPU events" in budget([])["problem"]
