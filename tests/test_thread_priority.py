"""serving/thread_priority.py: the engine's and the vocoder's threads under SCHED_FIFO (GPU only)."""

import os
import threading

import pytest

from moss_tts.serving import thread_priority as tp


class _Parked:
    """A thread that waits (never spins: a real-time thread here must not take the dev box's core)
    and, when asked, starts a child thread and records the child's policy."""

    def __init__(self):
        self.go, self.done = threading.Event(), threading.Event()
        self.child_policy = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        self.go.wait(10)
        child = threading.Thread(target=lambda: setattr(self, "child_policy", os.sched_getscheduler(0)))
        child.start()
        child.join(10)
        self.done.set()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.go.set()
        self.thread.join(10)


def test_priorities_parse_and_name_bad_values():
    assert tp.rt_priorities({}) == {"engine_rt_priority": 0, "vocoder_rt_priority": 0}
    assert tp.rt_priorities({"engine_rt_priority": "2", "vocoder_rt_priority": "1"}) == {
        "engine_rt_priority": 2, "vocoder_rt_priority": 1}
    with pytest.raises(ValueError, match="engine_rt_priority=100 must lie in"):
        tp.rt_priorities({"engine_rt_priority": "100"})
    with pytest.raises(ValueError, match="vocoder_rt_priority"):
        tp.rt_priorities({"vocoder_rt_priority": "high"})


def test_zero_or_cpu_leaves_the_thread_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(tp.os, "sched_setscheduler", lambda *a: calls.append(a))
    with _Parked() as parked:
        assert tp.give_rt_priority(parked.thread, 0) is None
        assert tp.give_threads_priority({"engine_rt_priority": 2}, False, {"engine_rt_priority": parked.thread}) == []
        # A layout without the thread (the vocoder over BLS): nothing to give, nothing to say.
        assert tp.give_threads_priority({"vocoder_rt_priority": 1}, True, {"vocoder_rt_priority": None}) == []
    assert calls == []


def test_a_thread_not_running_is_said():
    assert tp.give_rt_priority(threading.Thread(target=lambda: None), 2) == "the thread is not running"


def test_a_refusal_is_returned_with_its_parameter(monkeypatch):
    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(tp.os, "sched_setscheduler", refuse)
    with _Parked() as parked:
        problems = tp.give_threads_priority({"engine_rt_priority": 2}, True, {"engine_rt_priority": parked.thread})
    assert len(problems) == 1 and problems[0].startswith("engine_rt_priority: SCHED_FIFO 2 refused")


def test_the_policy_is_set_and_not_inherited():
    """Where the OS allows it (root or CAP_SYS_NICE), the thread runs SCHED_FIFO at the priority and
    a thread it starts runs the normal policy; elsewhere the refusal is returned, nothing raised."""
    with _Parked() as parked:
        problem = tp.give_rt_priority(parked.thread, 1)
        if problem is None:
            policy = os.sched_getscheduler(parked.thread.native_id)
            assert policy & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO
            assert os.sched_getparam(parked.thread.native_id).sched_priority == 1
        else:
            assert "refused" in problem
        parked.go.set()
        assert parked.done.wait(10)
    assert parked.child_policy == os.SCHED_OTHER
