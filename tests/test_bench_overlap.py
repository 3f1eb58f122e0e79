"""perf/bench_overlap.py's loop and comparison, on fake work (its GPU work needs the H200)."""

from __future__ import annotations

import threading
import time

import pytest

from perf.bench_overlap import Lane, Work, compare, run_lanes


def sleeper(ms: float, gate: threading.Lock = None) -> callable:
    """A call that takes `ms`; with `gate`, one at a time across threads (a shared "device")."""
    def call():
        if gate is None:
            time.sleep(ms / 1e3)
            return
        with gate:
            time.sleep(ms / 1e3)
    return call


def test_run_lanes_times_each_work_and_calls_its_upkeep_untimed():
    upkeep = []
    engine = Work("engine", 256, sleeper(4), lambda: upkeep.append(1), every=5)
    vocoder = Work("vocoder", 120, sleeper(2))
    got = run_lanes([(engine, Lane()), (vocoder, Lane())], seconds=0.3)
    assert set(got) == {"engine", "vocoder"}
    e, v = got["engine"], got["vocoder"]
    assert 3.5 <= e["ms_median"] <= 40 and 1.5 <= v["ms_median"] <= 40
    assert e["frames_per_s"] == pytest.approx(256 * e["calls"] / (e["ms_mean"] / 1e3 * e["calls"]))
    # Upkeep before call 0 (untimed, as the first call is) and then before calls 5, 10, ...
    made = e["calls"] + 1
    assert len(upkeep) == (made - 1) // 5 + 1


def test_a_failing_work_stops_both_threads_and_raises():
    def boom():
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):
        run_lanes([(Work("engine", 1, boom), Lane()), (Work("vocoder", 1, sleeper(1)), Lane())], seconds=5)


def test_compare_reports_shares_against_each_work_alone():
    """Fake work on a shared lock: together each gets about half of what it does alone, so the
    shares sum to about one (no gain, no loss), in both modes."""
    gate = threading.Lock()
    engine = Work("engine", 256, sleeper(3, gate))
    rounds = [Work("vocoder_12x10", 120, sleeper(3, gate))]
    got = compare(engine, rounds, lambda mode: (Lane(), Lane()), seconds=0.4)
    row = got["rounds"][0]
    assert row["round"] == "vocoder_12x10" and row["frames"] == 120
    for mode in ("two_streams", "one_stream"):
        assert 0.2 < row[mode]["engine_share"] < 0.8 and 0.2 < row[mode]["vocoder_share"] < 0.8
        assert 0.7 < row[mode]["sum_of_shares"] < 1.3
