"""In-band STOP (serving/stop_requests.py, contract STOP), without Triton: a STOP request is parsed
strictly, ends the running request of its id through the ledger, always gets exactly one final
response, and asks the model's other instances over their relay sockets (real Unix sockets) only
when its own instance runs no such request."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from moss_tts.contract.errors import InvalidRequest
from moss_tts.contract.tensors import INPUTS, MOSS_TTS_CODES_INPUTS
from moss_tts.pipeline.synthesis_request import parse_stop_input
from moss_tts.serving.request_ledger import RequestLedger
from moss_tts.serving.stall_watch import StallWatch
from moss_tts.serving.stop_requests import StopRequests, ask_stop
from moss_tts.sessions.relay import RelayServer, socket_path

FINAL = 1


def getter(**inputs):
    arrays = {name: np.array([value.encode() if isinstance(value, str) else value], dtype=INPUTS[name].numpy_dtype)
              for name, value in inputs.items()}

    def get(name):
        return arrays.get(name)
    get.names = tuple(arrays)  # as serving/triton_io.getter
    return get


class Sender:
    def __init__(self) -> None:
        self.sent = []
        self.lock = threading.Lock()

    def send(self, response=None, flags=0):
        with self.lock:
            self.sent.append((response, flags))

    def is_cancelled(self):
        return False


def test_stop_is_a_moss_tts_input_the_codes_ensemble_does_not_take():
    assert INPUTS["STOP"].optional and INPUTS["STOP"].dtype == "BYTES"
    assert "STOP" not in {t.name for t in MOSS_TTS_CODES_INPUTS}


def test_a_stop_request_names_its_request_and_carries_nothing_else():
    assert parse_stop_input(getter(TEXT="", STOP=" abc123 "), ("TEXT", "STOP")) == "abc123"
    assert parse_stop_input(getter(TEXT="Hello."), ("TEXT",)) is None  # any other request


@pytest.mark.parametrize("inputs, message", [
    (dict(TEXT="", STOP="a", SEED=3), "it also has SEED"),
    (dict(TEXT="Hello.", STOP="a"), "TEXT must be empty"),
    (dict(TEXT="", STOP="  "), "input STOP must be the id of the request"),
    (dict(TEXT="", STOP="x" * 257), "1 to 256 printable characters"),
    (dict(TEXT="", STOP="a\x00b"), "printable"),
])
def test_a_malformed_stop_is_invalid_argument_naming_what_to_fix(inputs, message):
    get = getter(**inputs)
    with pytest.raises(InvalidRequest, match=message):
        parse_stop_input(get, get.names)


def test_a_stop_ends_the_running_request_and_gets_one_empty_final(tmp_path):
    ledger = RequestLedger(FINAL)
    target, stop_sender = Sender(), Sender()
    running = ledger.track(target, "utt-1")
    stops = StopRequests(ledger, tmp_path / "moss_tts_0.sock", StallWatch(), FINAL,
                         ask_others=lambda *a: pytest.fail("asked other instances although the request ran here"))
    tracked = ledger.track(stop_sender, "utt-1.stop")
    assert stops.answered(getter(TEXT="", STOP="utt-1"), tracked)
    assert running.is_cancelled()  # the stream reads this as its client's cancel
    assert stop_sender.sent == [(None, FINAL)] and target.sent == []
    stats = ledger.stats()
    assert (stats.stopped, stats.in_flight_stop, stats.in_flight) == (1, 0, 1)  # the STOP ended; its target not yet


def test_a_stop_of_an_ended_or_unknown_request_is_answered_all_the_same(tmp_path):
    ledger = RequestLedger(FINAL)
    ended = ledger.track(Sender(), "utt-1")
    ended.send(flags=FINAL)
    stops = StopRequests(ledger, tmp_path / "moss_tts_0.sock", StallWatch(), FINAL)
    for name in ("utt-1", "never-seen"):
        stop_sender = Sender()
        assert stops.answered(getter(TEXT="", STOP=name), ledger.track(stop_sender))
        assert stop_sender.sent == [(None, FINAL)]
    assert ledger.stats().stopped == 0 and not ended.is_cancelled()


def test_a_non_stop_request_is_left_to_the_pipeline(tmp_path):
    ledger = RequestLedger(FINAL)
    sender = Sender()
    assert not StopRequests(ledger, tmp_path / "x.sock", StallWatch(), FINAL).answered(getter(TEXT="Hi."),
                                                                                      ledger.track(sender))
    assert sender.sent == [] and ledger.stats().in_flight_unread == 1


def test_a_stop_for_another_instance_is_asked_there_off_the_execute_thread(tmp_path):
    """Two instances, each with its ledger and relay socket: a STOP reaching instance 0 for a
    request that instance 1 runs stops it there; the STOP's final comes after the answer, from a
    thread of its own (execute() returns at once)."""
    directory = tmp_path / "claims"
    ledgers = [RequestLedger(FINAL), RequestLedger(FINAL)]
    paths = [socket_path(directory, f"moss_tts_{i}") for i in range(2)]
    servers = [RelayServer(paths[i], lambda m, c: None, ledgers[i].stop) for i in range(2)]
    try:
        running = ledgers[1].track(Sender(), "utt-9")
        answered = threading.Event()

        def slow_ask(*args):
            time.sleep(0.2)  # a slow peer must not hold execute()
            stopped = ask_stop(*args)
            answered.set()
            return stopped

        stops = StopRequests(ledgers[0], paths[0], StallWatch(), FINAL, ask_others=slow_ask)
        stop_sender = Sender()
        started = time.monotonic()
        assert stops.answered(getter(TEXT="", STOP="utt-9"), ledgers[0].track(stop_sender))
        assert time.monotonic() - started < 0.15 and stop_sender.sent == []
        assert answered.wait(5.0)
        deadline = time.monotonic() + 5.0
        while not stop_sender.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stop_sender.sent == [(None, FINAL)]
        assert running.is_cancelled() and ledgers[1].stats().stopped == 1
    finally:
        for server in servers:
            server.stop()


def test_ask_stop_counts_what_the_others_stopped_and_skips_an_unreachable_one(tmp_path):
    directory = tmp_path / "claims"
    ledger = RequestLedger(FINAL)
    ledger.track(Sender(), "utt-2")
    ledger.track(Sender(), "utt-2")
    own, peer = socket_path(directory, "moss_tts_0"), socket_path(directory, "moss_tts_1")
    server = RelayServer(peer, lambda m, c: None, ledger.stop)
    stale = socket_path(directory, "moss_tts_2")
    stale.touch()  # a socket file nobody listens on (an instance gone)
    try:
        assert ask_stop(directory, own, "utt-2", timeout_s=1.0) == 2
        assert ask_stop(directory, own, "utt-2", timeout_s=1.0) == 0  # already stopped
    finally:
        server.stop()


def test_a_peer_that_never_answers_costs_the_ask_its_deadline_only(tmp_path):
    import socket

    directory = tmp_path / "claims"
    directory.mkdir()
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(socket_path(directory, "moss_tts_1")))
    hung.listen(4)  # accepts (the kernel does), never reads or answers
    try:
        started = time.monotonic()
        assert ask_stop(directory, socket_path(directory, "moss_tts_0"), "utt-3", timeout_s=0.3) == 0
        assert time.monotonic() - started < 1.0
    finally:
        hung.close()
