"""sessions.relay: a session request spoken by another instance, over a real Unix socket
(no Triton): arrays arrive intact, exactly one final response reaches the client whatever
happens, a cancel on the receiving side reaches the holder, an unreachable or vanished holder is
UNAVAILABLE."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from moss_tts.contract.errors import ErrorKind
from moss_tts.sessions.relay import (RelayedStream, RelayServer, decode_array, encode_array, message_getter,
                                     read_message, relay, request_message, socket_path, write_message)


class Client:
    """TritonClient's interface, recording what reaches it."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.sent, self.errors, self.finals = [], [], 0
        self.cancel_after = cancel_after

    def send(self, audio, codes, context, final):
        self.sent.append((audio, codes, context))
        self.finals += final

    def send_error(self, message, kind):
        self.errors.append((message, ErrorKind(kind)))
        self.finals += 1

    def send_final(self):
        self.finals += 1

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after


@pytest.mark.parametrize("array", [
    np.arange(24, dtype=np.float32).reshape(2, 12),
    np.arange(36, dtype=np.int32).reshape(3, 12),
    np.zeros((0, 12), np.int32),
    np.array([b"RIFF\x00\xff binary"], dtype=np.object_),
    np.array([7], dtype=np.int64),
    np.array([True]),
])
def test_arrays_arrive_intact(array):
    out = decode_array(encode_array(array))
    assert out.dtype == array.dtype and out.shape == array.shape
    assert out.tolist() == array.tolist()


def test_a_request_message_gives_back_its_inputs():
    inputs = {"TEXT": np.array([b"Hello."], dtype=np.object_), "SESSION_INDEX": np.array([3], np.int32)}
    message = request_message(inputs, ["AUDIO"], "s:3")
    get = message_getter(message)
    assert get("TEXT").tolist() == [b"Hello."] and get("SESSION_INDEX").tolist() == [3] and get("SEED") is None
    assert message["requested"] == ["AUDIO"] and message["request_id"] == "s:3"


@pytest.fixture
def holder(tmp_path):
    """A RelayServer whose requests are run by `behaviour(message, client)` on a thread of its own."""
    seen = {}

    def accept(message, client):
        message_getter(message)  # as SessionAdmission.accept_relayed: in the relay's own thread
        seen["message"] = message
        threading.Thread(target=seen["behaviour"], args=(message, client), daemon=True).start()

    server = RelayServer(socket_path(tmp_path / "claims", "moss_tts_1_0"), accept)
    yield server, seen
    server.stop()


def audio(i):
    return np.full((2, 4), i, np.float32), np.full((1, 12), i, np.int32), np.zeros((0, 12), np.int32)


def test_responses_come_back_in_order_with_one_final(holder):
    server, seen = holder

    def speak(message, client):
        for i in range(3):
            client.send(*audio(i), final=i == 2)

    seen["behaviour"] = speak
    client = Client()
    RelayedStream(server.path, request_message({"TEXT": np.array([b"Hi."], dtype=np.object_)}, ["AUDIO", "CODES"], "x"),
                  client, lambda: False).run()
    assert client.finals == 1 and not client.errors
    assert [a[0, 0] for a, _, _ in client.sent] == [0, 1, 2]
    assert [c.tolist() for _, c, _ in client.sent] == [[[i] * 12] for i in range(3)]
    assert seen["message"]["request_id"] == "x"
    assert oct(server.path.stat().st_mode & 0o777) == oct(0o600) and (server.path.parent.stat().st_mode & 0o077) == 0


@pytest.mark.parametrize("end", ["error", "final_only"])
def test_an_error_or_an_empty_final_is_the_one_final(holder, end):
    server, seen = holder

    def speak(message, client):
        client.send(*audio(1), final=False)
        client.send_error("[INVALID_ARGUMENT] no", ErrorKind.INVALID_ARGUMENT) if end == "error" else client.send_final()

    seen["behaviour"] = speak
    client = Client()
    relay(server.path, request_message({}, ["AUDIO"], ""), client, client.is_cancelled, lambda: False)
    assert client.finals == 1 and len(client.sent) == 1
    assert client.errors == ([("[INVALID_ARGUMENT] no", ErrorKind.INVALID_ARGUMENT)] if end == "error" else [])


def test_a_cancel_on_the_receiving_side_reaches_the_holder(holder):
    server, seen = holder
    holder_saw_cancel = threading.Event()

    def speak(message, client):
        for i in range(1000):  # ~10 s unless cancelled; audio keeps flowing, the socket never idle
            if client.is_cancelled():
                holder_saw_cancel.set()
                client.send_error("cancelled", ErrorKind.CANCELLED)  # to a closed connection: dropped
                return
            client.send(*audio(i), final=False)
            time.sleep(0.01)
        client.send_final()

    seen["behaviour"] = speak
    client = Client(cancel_after=2)
    started = time.monotonic()
    relay(server.path, request_message({}, ["AUDIO"], ""), client, client.is_cancelled, lambda: False, poll_s=0.5)
    assert client.finals == 1 and client.errors[-1][1] is ErrorKind.CANCELLED
    assert holder_saw_cancel.wait(5), "the holder never saw the cancel"
    assert time.monotonic() - started < 5


def test_stopping_ends_the_relay_with_unavailable(holder):
    server, seen = holder
    seen["behaviour"] = lambda message, client: time.sleep(5)  # says nothing
    client, stopping = Client(), threading.Event()
    threading.Timer(0.2, stopping.set).start()
    relay(server.path, request_message({}, ["AUDIO"], ""), client, client.is_cancelled, stopping.is_set, poll_s=0.05)
    assert client.finals == 1 and client.errors[0][1] is ErrorKind.UNAVAILABLE and "shutting down" in client.errors[0][0]


def test_an_unreachable_or_vanished_holder_is_unavailable(holder, tmp_path):
    client = Client()
    relay(tmp_path / "nobody.sock", request_message({}, ["AUDIO"], ""), client, client.is_cancelled, lambda: False)
    assert client.finals == 1 and client.errors[0][1] is ErrorKind.UNAVAILABLE and "cannot be reached" in client.errors[0][0]

    server, seen = holder

    def vanish(message, client):
        client.send(*audio(0), final=False)
        client.conn.close()  # the holder's process died mid-request

    seen["behaviour"] = vanish
    client = Client()
    relay(server.path, request_message({}, ["AUDIO"], ""), client, client.is_cancelled, lambda: False, poll_s=0.05)
    assert client.finals == 1 and len(client.sent) == 1 and client.errors[0][1] is ErrorKind.UNAVAILABLE


def test_a_malformed_message_is_answered_and_the_relay_serves_on(holder):
    server, seen = holder
    seen["behaviour"] = lambda message, client: client.send_final()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(server.path))
    write_message(sock, {"inputs": {"TEXT": {"dtype": "|O", "shape": [1], "data": ""}}, "requested": [],
                         "request_id": ""})  # an object array as raw bytes: refused, never unpickled
    sock.settimeout(5)
    answer = read_message(sock)
    sock.close()
    assert answer["kind"] == "INTERNAL" and "object arrays" in answer["error"]
    client = Client()  # the next one is served
    relay(server.path, request_message({"TEXT": np.array([b"ok"], dtype=np.object_)}, ["AUDIO"], ""), client,
          client.is_cancelled, lambda: False)
    assert client.finals == 1 and not client.errors
