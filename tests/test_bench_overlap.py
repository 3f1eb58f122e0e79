"""perf/bench_overlap.py's loop and comparison, on fake work (its GPU work needs the H200)."""

from __future__ import annotations

import time

import pytest

from perf.bench_overlap import Lane, Work, compare, run_lanes


def sleeper(ms: float) -> callable:
    """A call that takes `ms`."""
    return lambda: time.sleep(ms / 1e3)


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
    """compare's arithmetic and its runs, on fixed rates (no clock: timed shares of sleeping threads
    flaked on the loaded 2-core CI machine): alone the engine makes 1,000 frames/s and the round
    400; together 600 and 100 on two streams, 500 and 200 on one."""
    lanes = {mode: (Lane(), Lane()) for mode in ("two_streams", "one_stream")}
    together = {"two_streams": (600.0, 100.0), "one_stream": (500.0, 200.0)}
    runs = []

    def fixed(jobs, seconds):
        runs.append([(work.name, lane) for work, lane in jobs])
        if len(jobs) == 1:
            return {jobs[0][0].name: {"frames_per_s": 1000.0 if jobs[0][0].name == "engine" else 400.0}}
        mode = next(m for m, pair in lanes.items() if pair == (jobs[0][1], jobs[1][1]))
        return {work.name: {"frames_per_s": rate} for (work, _), rate in zip(jobs, together[mode])}

    engine = Work("engine", 256, lambda: None)
    rounds = [Work("vocoder_12x10", 120, lambda: None)]
    got = compare(engine, rounds, lanes.__getitem__, seconds=1.0, run=fixed)
    assert got["engine_alone"]["frames_per_s"] == 1000.0
    row = got["rounds"][0]
    assert row["round"] == "vocoder_12x10" and row["frames"] == 120 and row["alone"]["frames_per_s"] == 400.0
    assert (row["two_streams"]["engine_share"], row["two_streams"]["vocoder_share"]) == (0.6, 0.25)
    assert row["two_streams"]["sum_of_shares"] == pytest.approx(0.85)
    assert (row["one_stream"]["engine_share"], row["one_stream"]["vocoder_share"]) == (0.5, 0.5)
    assert row["one_stream"]["sum_of_shares"] == pytest.approx(1.0)
    # The engine alone, the round alone (each on its own stream's lane), then both per mode on that mode's lanes.
    two, one = lanes["two_streams"], lanes["one_stream"]
    assert runs == [[("engine", two[0])], [("vocoder_12x10", two[1])],
                    [("engine", two[0]), ("vocoder_12x10", two[1])], [("engine", one[0]), ("vocoder_12x10", one[1])]]
