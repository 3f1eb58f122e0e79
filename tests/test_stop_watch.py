"""serving.stop_watch.ServerStopWatch with Triton's answers replayed (no Triton needed).

The answers are what tritonserver 2.51 gave a BLS call for a missing model, seen from a model that
loaded while another was still loading, then through its shutdown.
"""

from __future__ import annotations

import threading
import time

from moss_tts.serving.stop_watch import ServerStopWatch
from shared_state import SharedCounter, SharedList

STARTING = "Model moss_tts_shutdown_probe - Error when running inference: Server not ready"
SERVING = ("Model moss_tts_shutdown_probe - Error when running inference: Failed for execute the inference "
           "request. Model 'moss_tts_shutdown_probe' is not ready.")
STOPPING = STARTING  # the same words at shutdown
INTERVAL_S = 0.01


class Answers:
    """Plays Triton: answers each call with the next scripted message, then repeats the last. Called
    on the watch's thread while the test reads `calls`: a SharedCounter."""

    def __init__(self, *messages: str) -> None:
        self.messages = list(messages)
        self.calls = SharedCounter()

    def __call__(self) -> str:
        self.calls.add()
        return self.messages.pop(0) if len(self.messages) > 1 else self.messages[0]


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(INTERVAL_S)
    return predicate()


def test_it_asks_nothing_before_the_first_request():
    # "Server not ready" while the server starts must not stop the pool, and a call made while
    # Triton finalizes the instance can crash tritonserver: an idle model never asks.
    answers, stopped = Answers(STARTING), threading.Event()
    watch = ServerStopWatch(answers, stopped.set, interval_s=INTERVAL_S)
    time.sleep(30 * INTERVAL_S)
    watch.stop()
    assert wait_until(lambda: not watch.is_alive)
    assert answers.calls.value() == 0 and watch.asked == 0
    assert not stopped.is_set()


def test_armed_it_stops_once_at_the_first_server_not_ready_and_asks_no_more():
    answers, stops = Answers(SERVING, SERVING, SERVING, STOPPING), SharedList()
    watch = ServerStopWatch(answers, lambda: stops.append(time.monotonic()), interval_s=INTERVAL_S)
    watch.arm()
    assert wait_until(lambda: len(stops))
    assert wait_until(lambda: not watch.is_alive)
    calls = answers.calls.value()
    time.sleep(20 * INTERVAL_S)
    assert answers.calls.value() == calls == 4  # three "serving" answers, then the stop; nothing after it
    assert len(stops) == 1
    watch.stop()


def test_arming_again_is_harmless_and_stop_ends_the_asking():
    answers, stopped = Answers(SERVING), threading.Event()
    watch = ServerStopWatch(answers, stopped.set, interval_s=INTERVAL_S)
    for _ in range(3):
        watch.arm()  # every execute() arms it
    assert wait_until(lambda: answers.calls.value() >= 5)
    assert not stopped.is_set()
    watch.stop()
    assert wait_until(lambda: not watch.is_alive)
    calls = answers.calls.value()
    time.sleep(10 * INTERVAL_S)
    assert answers.calls.value() == calls  # stop() ends the asking


def test_other_answers_are_not_a_shutdown():
    # The stub refuses BLS outside execute's lifetime (initialize/finalize); an error of its own.
    answers, stopped = Answers("BLS is only supported during the 'execute' function.", "boom", SERVING), threading.Event()
    watch = ServerStopWatch(answers, stopped.set, interval_s=INTERVAL_S)
    watch.arm()
    assert wait_until(lambda: answers.calls.value() >= 4)
    assert not stopped.is_set()
    watch.stop()


def test_an_ask_that_raises_does_not_end_the_watch():
    calls, stopped = SharedCounter(), threading.Event()

    def ask():
        if calls.add() < 3:
            raise RuntimeError("IPC hiccup")
        return STOPPING

    watch = ServerStopWatch(ask, stopped.set, interval_s=INTERVAL_S)
    watch.arm()
    assert wait_until(stopped.is_set)  # the third answer, after two that raised
    assert calls.value() == 3
    watch.stop()
