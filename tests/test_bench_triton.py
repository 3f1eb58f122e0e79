"""perf/bench_triton.py: the playback model that counts underruns, and one short real run (the
H200 numbers come from the same script; perf/RESULTS.md)."""

from __future__ import annotations

import json

import pytest

from perf.bench_triton import StreamResult, chunk_gaps, gaps_by_chunk, main, playback_gaps, percentiles


def test_a_chunk_that_arrives_before_the_buffer_runs_dry_is_no_underrun():
    # first chunk 0.16 s of audio at t=0.1; the next (0.8 s) at 0.2: playback never stops
    assert playback_gaps([(0.1, 0.16), (0.2, 0.8), (0.9, 0.8)]) == (0, 0.0)


def test_a_late_chunk_is_one_underrun_and_its_gap_is_the_stall():
    # playing until 0.26; the next chunk comes at 0.5 -> 0.24 s of silence; then until 1.3, next at 1.4
    underruns, stall = playback_gaps([(0.1, 0.16), (0.5, 0.8), (1.4, 0.8)])
    assert underruns == 2 and stall == pytest.approx(0.24 + 0.1)


def test_underruns_are_counted_by_the_chunk_that_came_late():
    assert chunk_gaps([]) == [] and chunk_gaps([(0.1, 0.16)]) == []
    gaps = chunk_gaps([(0.1, 0.16), (0.5, 0.8), (1.4, 0.8)])
    assert [i for i, _ in gaps] == [1, 2] and [g for _, g in gaps] == pytest.approx([0.24, 0.1])
    played = StreamResult.played(0.1, 2.0, 1.76, [(0.1, 0.16), (0.5, 0.8), (1.4, 0.8)])  # every bench's results
    assert (played.underruns, played.gaps) == (2, tuple(gaps)) and played.stall_s == pytest.approx(0.34)
    late = [StreamResult(0.1, 2.0, 1.0, 2, 0.34, gaps=tuple(gaps)),
            StreamResult(0.1, 2.0, 1.0, 1, 0.05, gaps=((1, 0.05),)),
            StreamResult(0.1, 9.0, 8.0, 2, 0.02, gaps=((9, 0.01), (12, 0.01))),
            StreamResult(0.1, 2.0, 1.0, 0, 0.0)]
    assert gaps_by_chunk(late) == {"1": {"underruns": 2, "stall_ms": 290.0}, "2": {"underruns": 1, "stall_ms": 100.0},
                                   "8+": {"underruns": 2, "stall_ms": 20.0}}
    assert list(gaps_by_chunk(late, last=2)) == ["1", "2+"]


def test_percentiles_of_nothing_are_empty():
    assert percentiles([]) == {}
    assert percentiles([3.0, 1.0, 2.0]) == {"p50": 2.0, "p95": 3.0, "p99": 3.0, "max": 3.0}


@pytest.mark.triton
def test_a_short_run_against_the_server_reports_every_level(triton, tmp_path):
    out = tmp_path / "bench.json"
    code = main(["--url", triton.grpc_url, "--concurrency", "1,3", "--mode", "stream,offline", "--frames", "8",
                 "--requests", "2", "--warmup", "1", "--out", str(out)])
    assert code == 0
    reports = json.loads(out.read_text())
    assert [(r["mode"], r["concurrency"]) for r in reports] == [("stream", 1), ("stream", 3), ("offline", 1), ("offline", 3)]
    for r in reports:
        assert r["failures"] == 0 and r["requests"] == 2 * r["concurrency"]
        assert r["audio_s"] == pytest.approx(r["requests"] * 8 / 12.5)
        assert 0 < r["ttfa_ms"]["p50"] <= r["ttfa_ms"]["max"] and r["audio_s_per_s"] > 0
        assert sum(v["underruns"] for v in r["underruns_by_chunk"].values()) == r["underruns"]
        # The level's wall-clock window, by which perf/trace_phases.py cuts the server's trace.
        assert r["wall_end"] - r["wall_start"] == pytest.approx(r["wall_s"])
        # The machine's CPU over the level: the client and the server were busy on it.
        assert r["host_busy_cores"] > 0 and r["host_steal_cores"] >= 0


@pytest.mark.triton
def test_client_processes_split_the_workers_and_merge_their_results(triton, tmp_path):
    out = tmp_path / "bench.json"
    code = main(["--url", triton.grpc_url, "--concurrency", "3", "--mode", "stream", "--frames", "8",
                 "--requests", "2", "--warmup", "0", "--processes", "2", "--out", str(out)])
    (report,) = json.loads(out.read_text())
    assert code == 0 and report["failures"] == 0 and report["requests"] == 6
    assert report["audio_s"] == pytest.approx(6 * 8 / 12.5) and report["wall_s"] > 0
    assert report["wall_end"] - report["wall_start"] == pytest.approx(report["wall_s"])
    assert report["client_start_spread_s"] >= 0 and report["start_together"] is False


@pytest.mark.triton
def test_start_together_holds_the_client_processes_at_a_barrier(triton, tmp_path):
    out = tmp_path / "bench.json"
    code = main(["--url", triton.grpc_url, "--concurrency", "3", "--mode", "stream", "--frames", "8",
                 "--requests", "1", "--warmup", "0", "--processes", "3", "--start-together", "--out", str(out)])
    (report,) = json.loads(out.read_text())
    assert code == 0 and report["failures"] == 0 and report["requests"] == 3 and report["start_together"] is True
    # Released together: their first requests within a fraction of a second (without the barrier
    # each process starts when its own imports are done).
    assert report["client_start_spread_s"] < 0.5, report
