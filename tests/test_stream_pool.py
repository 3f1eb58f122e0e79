"""StreamPool (bounded streams on reusable threads) and StallWatch (stuck work), no Triton."""

from __future__ import annotations

import threading

import pytest

from moss_tts.serving.stall_watch import StallWatch
from moss_tts.serving.stream_pool import StreamPool
from shared_state import SharedList


def test_refuses_beyond_capacity_then_accepts_again():
    pool, release, started = StreamPool(2), threading.Event(), threading.Semaphore(0)

    def stream():
        started.release()
        release.wait(10)

    assert pool.try_start(stream) and pool.try_start(stream)
    assert started.acquire(timeout=5) and started.acquire(timeout=5)
    assert not pool.try_start(stream) and pool.num_active == 2  # full: refused at once, nothing queued
    assert pool.refusal() == "server is busy: 2 streams; retry later"
    release.set()
    assert pool.stop(10) and pool.num_active == 0


def test_stop_refuses_new_streams_and_waits_for_running_ones():
    pool, seen = StreamPool(4), SharedList()  # appended by the stream's thread and the stopper
    proceed = threading.Event()

    def stream():
        proceed.wait(10)
        seen.append(pool.is_stopping())  # a running stream sees the flag and ends

    assert pool.try_start(stream)
    stopper = threading.Thread(target=lambda: seen.append(pool.stop(10)))
    stopper.start()
    while not pool.is_stopping():
        pass
    assert not pool.try_start(stream)
    assert pool.refusal() == "server is shutting down; retry later"
    proceed.set()
    stopper.join(10)
    assert seen.snapshot() == [True, True]


def test_stop_reports_streams_that_did_not_end():
    pool, release = StreamPool(1), threading.Event()
    pool.try_start(lambda: release.wait(10))
    assert pool.stop(0.2) is False and pool.num_active == 1
    release.set()


def test_a_stream_that_raises_frees_its_place():
    pool = StreamPool(1)

    def broken():
        raise RuntimeError("bug")

    assert pool.try_start(broken)
    assert pool.stop(5) and pool.num_active == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_streams_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="max_streams"):
        StreamPool(bad)


def test_stall_watch_reports_the_oldest_running_unit():
    now = [100.0]
    watch = StallWatch(clock=lambda: now[0])
    assert watch.oldest()[0] == 0.0
    with watch.working():
        now[0] = 103.0
        with watch.working():
            now[0] = 110.0
            assert watch.oldest()[0] == 10.0  # the outer unit started at 100
        assert watch.oldest()[0] == 10.0
    assert watch.oldest()[0] == 0.0  # idle is never stalled


def test_stall_watch_names_the_oldest_running_unit():
    """The heartbeat's log says what stalled: the oldest unit's name, not the newest's."""
    now = [100.0]
    watch = StallWatch(clock=lambda: now[0])
    assert watch.oldest() == (0.0, "")
    with watch.working("a final response send"):
        now[0] = 104.0
        with watch.working("a BLS call to ref_encoder"):
            now[0] = 131.0
            assert watch.oldest() == (31.0, "a final response send")
        with watch.working():  # unnamed
            assert watch.oldest() == (31.0, "a final response send")
    with watch.working():
        assert watch.oldest() == (0.0, "work")
    assert watch.oldest() == (0.0, "")


def test_oldest_of_names_the_longest_running_part():
    from moss_tts.serving.stall_watch import oldest_of
    assert oldest_of((3.0, "an engine step"), (31.0, "a response send"), (0.0, "a vocoder round")) == \
        (31.0, "a response send")
    assert oldest_of((0.0, "an engine step"), (0.0, ""))[0] == 0.0


def test_stall_watch_forgets_a_unit_that_raised():
    watch = StallWatch()
    with pytest.raises(KeyError):
        with watch.working():
            raise KeyError("x")
    assert watch.oldest()[0] == 0.0


def test_a_finished_stream_leaves_its_thread_for_the_next_one():
    pool, names, done = StreamPool(4), SharedList(), threading.Semaphore(0)  # appended by the pool's threads

    def stream():
        names.append(threading.current_thread().name)
        done.release()

    for _ in range(5):  # one after another: each start finds the thread of the one before idle
        assert pool.try_start(stream) and done.acquire(timeout=5)
        while pool.num_active:  # the thread is idle once its stream is counted done
            pass
    assert len(set(names.snapshot())) == 1, names.snapshot()
    # Two at once: the idle thread takes one, a new thread the other, never more than max_streams.
    gate = threading.Event()
    assert pool.try_start(lambda: (gate.wait(5), stream())) and pool.try_start(lambda: (gate.wait(5), stream()))
    gate.set()
    assert done.acquire(timeout=5) and done.acquire(timeout=5) and pool.stop(5)
    assert len(set(names.snapshot())) == 2 and pool.num_active == 0
