"""The first-audio trace on the real server: with MOSS_TTS_FIRST_AUDIO_TRACE set, tritonserver's
`moss_tts` stub writes a line per request, and perf/trace_phases.py cuts them by perf/shim_load.py's
levels (the H200 run's profile of a burst, issue 31, goes through exactly this)."""

from __future__ import annotations

import json

import pytest

from moss_tts.pipeline.first_audio_trace import ENV, MOMENTS


def test_phases_are_the_steps_between_moments_and_a_session_level_counts_first_sentences():
    from perf.trace_phases import level_phases, phases

    assert phases({"thread": 1.0, "queued": 3.0, "engine": 10.0, "read": 11.0, "sent": 20.0}) == \
        {"thread": 1.0, "queued": 2.0, "engine": 7.0, "read": 1.0, "sent": 9.0, "total": 20.0}
    traces = [{"received": 10.0 + i, "outcome": "ok", "session_index": i % 2, "ms": {"thread": 1.0, "sent": 5.0 + i}}
              for i in range(4)] + [{"received": 12.5, "outcome": "ok", "session_index": 0, "ms": {"thread": 1.0}}]
    level = {"transport": "ws", "concurrency": 2, "wall_start": 10.0, "wall_end": 13.0}
    row = level_phases(traces, level)
    assert row["requests"] == 2  # index 0 at 10 and 12 s; the one at 12.5 s sent no audio
    assert row["phases_ms"]["total"] == {"p50": 6.0, "p95": 6.9} and row["slowest_tenth_mean_ms"]["total"] == 7.0
    assert level_phases(traces, {**level, "transport": "grpc"})["requests"] == 0  # no session_index None


def test_bench_triton_levels_cut_the_trace_by_mode(tmp_path):
    """perf/bench_triton.py writes a list of levels that name a mode, not a transport."""
    from perf.trace_phases import main as trace_phases

    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"received": at, "outcome": "ok", "session_index": None,
                                         "ms": {"thread": 1.0, "sent": sent}}) + "\n"
                             for at, sent in ((10.5, 4.0), (11.0, 6.0), (20.5, 50.0))))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps([{"mode": "stream", "concurrency": 2, "wall_start": 10.0, "wall_end": 12.0},
                                 {"mode": "offline", "concurrency": 2, "wall_start": 20.0, "wall_end": 21.0},
                                 {"mode": "stream", "concurrency": 1, "wall_start": 0.0, "wall_end": 0.0}]))
    out = tmp_path / "phases.json"
    assert trace_phases(["--trace", str(trace), str(bench), "--out", str(out)]) == 0
    rows = json.loads(out.read_text())  # the level without a window (an old JSON) is left out
    assert [(r["transport"], r["requests"]) for r in rows] == [("grpc_stream", 2), ("grpc_offline", 1)]
    assert rows[0]["phases_ms"]["total"] == {"p50": 5.0, "p95": 5.9}


@pytest.mark.triton
def test_the_served_model_traces_each_request_and_the_levels_cut_them(tiny_dir, tmp_path, monkeypatch):
    from perf.shim_load import main as shim_load
    from perf.trace_phases import main as trace_phases
    from triton_server import start_server, stop_server

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv(ENV, str(trace))  # start_server passes os.environ on to tritonserver and its stubs
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp_path / "server.log")
    try:
        levels = tmp_path / "levels.json"
        assert shim_load(["--grpc-url", server.grpc_url, "--transports", "grpc,grpc_session", "--concurrency", "1",
                          "--requests", "1", "--processes", "1", "--frames", "8", "--segment-frames", "4",
                          "--words-per-s", "400", "--timeout", "60", "--out", str(levels)]) == 0
    finally:
        stop_server(server)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    streamed = [t for t in lines if t["session_index"] is None]
    sessions = sorted(t["session_index"] for t in lines if t["session_index"] is not None)
    # The warm-up stream of each transport, then 8 streams at one stream; sessions: 3 sentences each.
    assert len(streamed) == 9 and sessions == [i for i in range(3) for _ in range(9)]
    assert all(t["outcome"] == "ok" and list(t["ms"]) == list(MOMENTS) for t in lines), lines[:2]
    out = tmp_path / "phases.json"
    assert trace_phases(["--trace", str(trace), str(levels), "--out", str(out)]) == 0
    rows = {row["transport"]: row for row in json.loads(out.read_text())}
    assert rows["grpc"]["requests"] == 8 and rows["grpc_session"]["requests"] == 8
    for row in rows.values():
        total = row["phases_ms"]["total"]["p50"]
        assert 0 < total < 60_000 and set(row["phases_ms"]) == {*MOMENTS, "total"}
