"""serving/gpu_trace.py (the stub's on-request GPU trace) and perf/gpu_trace_budget.py (its budget),
without a GPU: the watcher on a fake recorder and on the real one (which a CPU refuses), the budget
on a hand-made trace whose busy, idle, overlap, steps and gaps are known."""

from __future__ import annotations

import gzip
import json
import threading
import time

import pytest

from moss_tts.serving.gpu_trace import ENV, GpuTrace, record_cuda, requested_seconds
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


def test_requested_seconds():
    assert requested_seconds("") == 2.0
    assert requested_seconds(" 0.5\n") == 0.5
    for bad in ("0", "31", "-1"):
        with pytest.raises(ValueError, match="0.1-30"):
            requested_seconds(bad)
    with pytest.raises(ValueError):
        requested_seconds("two")


def test_off_without_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    trace = GpuTrace.from_env()
    assert trace.thread is None and trace.directory is None
    trace.stop()  # nothing to stop


def test_a_request_is_recorded_written_and_removed(tmp_path):
    recorded, lock = [], threading.Lock()  # written on the watcher's thread, read on this one

    def record(seconds, path):
        with lock:
            recorded.append(seconds)
        path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 5}]}))

    trace = GpuTrace(tmp_path, poll_s=0.01, record=record)
    try:
        ask(tmp_path, "0.25")
        assert wait_for(lambda: not (tmp_path / "request").exists())
        with lock:
            assert recorded == [0.25]
        with gzip.open(tmp_path / "trace-0.json.gz", "rt") as f:
            assert json.load(f)["traceEvents"][0]["name"] == "k"
        assert {p.name for p in tmp_path.iterdir()} == {"trace-0.json.gz"}  # nothing half-written stays
        ask(tmp_path, "99")  # out of range: answered, and the watcher goes on
        assert wait_for(lambda: (tmp_path / "trace-1.error").exists())
        assert "0.1-30" in (tmp_path / "trace-1.error").read_text()
        ask(tmp_path, "")
        assert wait_for(lambda: (tmp_path / "trace-2.json.gz").exists())
        with lock:
            assert recorded == [0.25, 2.0]
    finally:
        trace.stop()
    assert not trace.thread.is_alive()


def test_the_real_recorder_fails_cleanly_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the CPU's refusal is what this checks")
    trace = GpuTrace(tmp_path, poll_s=0.01, record=record_cuda)
    try:
        ask(tmp_path, "0.1")
        assert wait_for(lambda: (tmp_path / "trace-0.error").exists())
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


def test_budget_of_an_empty_trace_says_so(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": []}))
    assert main([str(path)]) == 1
    assert "no GPU events" in budget([])["problem"]
