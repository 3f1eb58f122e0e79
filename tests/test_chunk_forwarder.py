"""ChunkForwarder (pipeline/chunk_forwarder.py, the moss_tts parameter `vocoder_forward_chunks`): the
engine's thread hands a plain streamed request's chunks to its vocoder sequence as it delivers
them. With the real engine (tiny checkpoint, CPU) behind EngineStreams and a recording vocoder:
every chunk is handed over on the engine's thread, in order, START on the first, END last from
the stream's thread, the client gets all the audio and one final; off, continuation and failure
paths stay on the stream's thread; after a cancel nothing is handed over behind the END."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from moss_tts.contract.errors import ChildError, ErrorKind
from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine.events import CodesChunk, Finished
from moss_tts.engine.request import EngineRequest
from moss_tts.pipeline.chunk_forwarder import ChunkForwarder
from moss_tts.pipeline.engine_codes import EngineCodes
from moss_tts.pipeline.engine_streams import CodesFeed, EngineStreams
from moss_tts.pipeline.speech_stream import SpeechStream
from moss_tts.pipeline.stream_ports import AUDIO_READY, Ready
from shared_state import SharedList
from test_engine_codes import streams, synthesis  # noqa: F401 (streams: the fixture, shared)

ENGINE_THREAD = "moss-tts-engine"


class Children:
    """The in-process children (TritonChildren's shape) with a vocoder that answers at once and
    records each call: (thread name, frames, start, end). fail_first_forward: the engine thread's
    first call raises (and, with retry_fails, every call after it); wake_early_s: a call wakes the
    stream, then returns that much later (its audio ready before it is in flight); fail_call: the
    audio of that call (0-based) fails."""

    def __init__(self, codes: EngineCodes, fail_first_forward=False, retry_fails=True, supports=True,
                 wake_early_s=0.0, fail_call=None, hold_from_call=None):
        self.codes, self.calls = codes, SharedList()
        self.fail_first_forward, self.retry_fails, self.supports = fail_first_forward, retry_fails, supports
        self.wake_early_s, self.fail_call = wake_early_s, fail_call
        self.first_call_at = None
        # hold_from_call: the engine thread's calls from that one on wait (at most 1 s) for an END first
        self.hold_from_call, self.end_called = hold_from_call, threading.Event()

    def stream_codes(self):
        return self.codes.chunks()

    def abort_codes(self):
        self.codes.abort()

    def forward_chunks(self, forward):
        if not self.supports:
            return None
        self.codes.forward = forward
        self.forward_wakes = SharedList()
        return lambda: (self.forward_wakes.append(1), self.codes.wake())

    def vocode(self, codes, start, end, deadline=None):
        thread = threading.current_thread().name
        if self.fail_first_forward and thread == ENGINE_THREAD:
            self.fail_first_forward = False
            self.failing = self.retry_fails  # the stream's own call of the same chunk fails as well, or not
            raise ChildError("[UNAVAILABLE] vocoder refused", ErrorKind.UNAVAILABLE)
        if getattr(self, "failing", False):
            raise ChildError("[UNAVAILABLE] vocoder refused", ErrorKind.UNAVAILABLE)
        if end:
            self.end_called.set()
        index = len(self.calls.snapshot())
        if self.hold_from_call is not None and index >= self.hold_from_call and thread == ENGINE_THREAD:
            self.end_called.wait(1.0)
        if self.first_call_at is None:
            self.first_call_at = time.monotonic()
        index = len(self.calls.snapshot())
        self.calls.append((thread, codes.shape[0], start, end))
        audio = np.full((2, codes.shape[0] * 4), 1.0, np.float32)
        if index == self.fail_call:
            pending = Failed()
        else:
            pending = Ready(audio)
        self.codes.wake()  # answered: the stream sends it when it next looks
        time.sleep(self.wake_early_s)  # ... before the caller has it in flight
        return pending


class Failed(Ready):
    def __init__(self):
        super().__init__(None)

    def result(self, timeout=None):
        time.sleep(0.2)  # the engine's next hand-over is under way before the stream closes
        raise ChildError("[INTERNAL] vocoder decode failed", ErrorKind.INTERNAL)


class Client:
    def __init__(self, cancel_after_sends=None):
        self.sent, self.finals, self.errors = SharedList(), 0, []
        self.cancel_after_sends = cancel_after_sends
        self.first_sent_at = None

    def send(self, audio, codes, context, final):
        if self.first_sent_at is None:
            self.first_sent_at = time.monotonic()
        self.sent.append(codes.shape[0])
        self.finals += final

    def send_error(self, message, kind):
        self.errors.append(kind)
        self.finals += 1

    def send_final(self):
        self.finals += 1

    def is_cancelled(self):
        return self.cancel_after_sends is not None and len(self.sent.snapshot()) >= self.cancel_after_sends


def run(s, builder, forward=True, client=None, reference=None, children_kwargs=None, **values):
    values = {"MAX_FRAMES": 9, "IGNORE_STOP": True, "FIRST_CHUNK_FRAMES": 2, "CHUNK_FRAMES": 3, **values}
    codes = EngineCodes(s, builder, synthesis("f", **values), lambda: reference)
    children, client = Children(codes, **(children_kwargs or {})), client or Client()
    stream = SpeechStream(children, client, stream=True, wants_audio=True, forward_chunks=forward, cancel_poll_s=0)
    stream.run()
    return children, client, stream


@pytest.mark.parametrize("host_turn_ms", [0, 4])
def test_the_engine_thread_hands_every_chunk_over_in_order(streams, builder, host_turn_ms):
    s = streams(host_turn_ms=host_turn_ms)
    children, client, stream = run(s, builder)
    calls = children.calls.snapshot()
    chunks, end = calls[:-1], calls[-1]
    assert [c[1] for c in chunks] == [2, 3, 3, 1]  # 9 frames at the first-chunk / chunk rule 2, 3
    assert all(c[0] == ENGINE_THREAD for c in chunks), calls
    assert [c[2] for c in chunks] == [True, False, False, False] and not any(c[3] for c in chunks)
    assert end[1:] == (0, False, True) and end[0] != ENGINE_THREAD  # END from the stream, after them all
    assert client.sent.snapshot() == [2, 3, 3, 1] and client.finals == 1 and not client.errors
    assert stream._forwarder.forwarded == 4 and not stream._forwarder.is_open
    assert s.num_in_flight == 0
    assert stream._forwarder._take is None  # closed, it lets go of the stream: no reference cycle


def test_off_or_unsupported_the_stream_thread_hands_them_over(streams, builder):
    s = streams(host_turn_ms=4)
    for kwargs in (dict(forward=False), dict(children_kwargs=dict(supports=False))):
        children, client, stream = run(s, builder, **kwargs)
        assert stream._forwarder is None
        assert [c[1] for c in children.calls.snapshot()] == [2, 3, 3, 1, 0]
        assert all(c[0] != ENGINE_THREAD for c in children.calls.snapshot())
        assert client.sent.snapshot() == [2, 3, 3, 1] and client.finals == 1


def test_a_continuation_primes_on_its_own_thread(streams, builder):
    ref = np.random.default_rng(0).integers(0, 1024, (1, 5, 12)).astype(np.int32)
    children, client, _ = run(streams(), builder, reference=ref, MODE="continuation", REFERENCE_TEXT="It starts ")
    calls = children.calls.snapshot()
    assert calls[0][1:] == (5, True, False)  # the context opens the sequence, then the chunks follow it
    assert all(c[0] != ENGINE_THREAD for c in calls)
    assert client.finals == 1 and not client.errors


def test_a_failed_hand_over_falls_to_the_stream_which_ends_with_the_error(streams, builder):
    children, client, stream = run(streams(), builder, children_kwargs=dict(fail_first_forward=True))
    assert client.errors == [ErrorKind.UNAVAILABLE] and client.finals == 1
    assert stream._forwarder.forwarded == 0 and not stream._forwarder.is_open
    assert children.calls.snapshot() == []  # nothing reached the vocoder; the END was refused too


def test_after_a_cancel_nothing_is_handed_over_behind_the_end(streams, builder):
    s = streams(host_turn_ms=4)
    children, client, stream = run(s, builder, client=Client(cancel_after_sends=1), MAX_FRAMES=400,
                                   FIRST_CHUNK_FRAMES=1, CHUNK_FRAMES=1)
    assert client.errors == [ErrorKind.CANCELLED] and client.finals == 1
    time.sleep(0.3)  # the engine delivers whatever it still had before the abort lands
    calls = children.calls.snapshot()
    assert calls[-1][1:] == (0, False, True), calls  # the END is the sequence's last call
    deadline = time.monotonic() + 10
    while s.engine.stats().running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.engine.stats().running == 0 and s.num_in_flight == 0


def test_the_feed_queues_what_is_not_forwarded():
    taken = []
    feed = CodesFeed("r")
    chunk = CodesChunk("r", np.zeros((2, 12), np.int32), 0)
    feed.forward = lambda c: taken.append(c) or len(taken) == 1  # takes the first, declines the second
    feed.put(chunk)
    feed.put(chunk)
    feed.put(AUDIO_READY)  # never offered to the forwarder
    feed.put(Finished("r", "max_frames", None, 4))
    assert taken == [chunk, chunk]
    assert [feed.next(0) for _ in range(3)] == [chunk, AUDIO_READY, Finished("r", "max_frames", None, 4)]
    assert feed.first_codes_at > 0


def test_the_forwarder_declines_once_closed_or_failed_and_never_raises():
    took = []
    forward = ChunkForwarder(lambda codes: took.append(codes.shape[0]))
    chunk = CodesChunk("r", np.zeros((3, 12), np.int32), 0)
    assert forward(chunk) and took == [3] and forward.forwarded == 1
    forward.close()
    assert not forward(chunk) and took == [3]

    def broken(codes):
        raise RuntimeError("bug")

    failing = ChunkForwarder(broken)
    assert not failing(chunk) and not failing.is_open
    assert not failing(chunk)  # declines every later one, so the stream takes them in order


def test_audio_ready_before_its_call_is_in_flight_still_wakes_the_stream(streams, builder):
    """The engine thread's call completes (its wake comes) before the call is in the stream's
    in-flight list: the forwarder wakes the stream again once it is (each call here is answered
    at once, so every forwarded chunk wakes it twice), and the first audio does not wait for the
    next event."""
    children, client, stream = run(streams(), builder, children_kwargs=dict(wake_early_s=0.05))
    assert client.finals == 1 and not client.errors and client.sent.snapshot() == [2, 3, 3, 1]
    assert len(children.forward_wakes.snapshot()) == stream._forwarder.forwarded == 4
    assert client.first_sent_at - children.first_call_at < 0.5, client.first_sent_at - children.first_call_at


def test_a_failed_hand_over_whose_retry_succeeds_still_opens_the_sequence(streams, builder):
    children, client, stream = run(streams(), builder, children_kwargs=dict(fail_first_forward=True, retry_fails=False))
    calls = children.calls.snapshot()
    assert calls[0][1:] == (2, True, False) and calls[0][0] != ENGINE_THREAD  # the stream's own call, with START
    assert client.sent.snapshot() == [2, 3, 3, 1] and client.finals == 1 and not client.errors
    assert stream._forwarder.forwarded == 0


def test_a_stream_that_ends_with_an_error_closes_its_forwarder_before_its_end(streams, builder):
    s = streams(host_turn_ms=4)
    children, client, stream = run(s, builder, children_kwargs=dict(fail_call=1), MAX_FRAMES=400,
                                   FIRST_CHUNK_FRAMES=1, CHUNK_FRAMES=1)
    assert client.errors == [ErrorKind.INTERNAL] and client.finals == 1
    assert not stream._forwarder.is_open and stream._forwarder._take is None
    time.sleep(0.3)
    assert children.calls.snapshot()[-1][1:] == (0, False, True)


def test_a_stream_never_run_installs_nothing(streams, builder):
    """A stream the pool refuses never runs: nothing of it is handed to the engine's feed."""
    codes = EngineCodes(streams(), builder, synthesis("never"), lambda: None)
    SpeechStream(Children(codes), Client(), stream=True, wants_audio=True, forward_chunks=True)
    assert codes.forward is None


def test_the_stream_closes_its_forwarder_before_it_ends_the_sequence(streams, builder):
    """A stream that fails while the engine's thread is inside a hand-over: closing waits for that
    hand-over, and only then does the END go in. Here every hand-over from the third call on waits
    (at most 1 s) for an END: closed first, the END comes after it; with the END first, the waiting
    hand-over's call would land behind it."""
    s = streams(host_turn_ms=4)
    children, client, stream = run(s, builder, children_kwargs=dict(fail_call=1, hold_from_call=2), MAX_FRAMES=400,
                                   FIRST_CHUNK_FRAMES=1, CHUNK_FRAMES=1)
    assert client.errors == [ErrorKind.INTERNAL] and client.finals == 1
    time.sleep(0.3)
    calls = children.calls.snapshot()
    assert calls[-1][1:] == (0, False, True) and [c[3] for c in calls].count(True) == 1, calls


def test_closing_waits_for_a_hand_over_in_progress():
    entered, release, closed = threading.Event(), threading.Event(), threading.Event()

    def take(codes):
        entered.set()
        release.wait(5)

    forward = ChunkForwarder(take)
    chunk = CodesChunk("r", np.zeros((1, 12), np.int32), 0)
    handing = threading.Thread(target=forward, args=(chunk,))
    handing.start()
    assert entered.wait(5)
    closer = threading.Thread(target=lambda: (forward.close(), closed.set()))
    closer.start()
    assert not closed.wait(0.2)  # the hand-over holds it
    release.set()
    assert closed.wait(5) and not forward.is_open and forward.forwarded == 1
    handing.join(5)
    closer.join(5)


def test_the_streams_count_only_what_was_forwarded():
    class Quiet:
        def submit(self, request):
            pass

    s = EngineStreams(lambda on_event: Quiet())
    rows = torch.zeros((3, 13), dtype=torch.long)
    takes = iter([True, False, True])
    s.submit(EngineRequest("a", rows, SamplingParams()), forward=lambda c: next(takes))
    s.submit(EngineRequest("b", rows, SamplingParams()))
    chunk = lambda rid: CodesChunk(rid, np.zeros((2, 12), np.int32), 0)
    for event in (chunk("a"), chunk("a"), chunk("b"), chunk("a"), Finished("a", "max_frames", None, 6)):
        s._route(event)
    assert s.chunks_forwarded == 2
