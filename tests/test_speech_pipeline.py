"""The moss_tts model's per-request policy with fake children and client (no Triton)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from moss_tts.contract.errors import ChildError, ErrorKind
from moss_tts.pipeline.speech_stream import CANCEL_POLL_S, SpeechStream
from moss_tts.pipeline.stream_ports import AUDIO_READY, CodesChunk, Ready

EMPTY = np.zeros((0, 12), np.int32)


def codes(n, start=0):
    return (np.arange(start, start + n)[:, None] + np.zeros((1, 12), np.int64)).astype(np.int32)


class FakeChildren:
    def __init__(self, chunks, fail_after=None):
        self.chunks, self.fail_after = chunks, fail_after
        self.vocoder_calls, self.log = [], []

    def stream_codes(self):
        try:
            for i, chunk in enumerate(self.chunks):
                if self.fail_after is not None and i == self.fail_after:
                    raise ChildError("[INVALID_ARGUMENT] reference audio could not be decoded", ErrorKind.INVALID_ARGUMENT)
                yield chunk
        finally:
            self.log.append("closed")

    def abort_codes(self):
        self.log.append("aborted")

    def vocode(self, c, start, end, deadline=None):
        self.vocoder_calls.append((c.shape[0], start, end))
        if start and getattr(self, "fail_start", False):
            raise ChildError("[UNAVAILABLE] all 288 vocoder slots hold active sequences", ErrorKind.UNAVAILABLE)
        return Ready(np.full((2, c.shape[0] * 4), float(c.shape[0]), np.float32))


class FakeClient:
    def __init__(self, cancel_after=None):
        self.sent, self.finals, self.errors = [], 0, []  # sent: (audio frames or None, code frames, context frames)
        self.cancel_after = cancel_after
        self.checks = 0

    def send(self, audio, codes, context, final):
        self.sent.append((None if audio is None else audio.shape[1] // 4, codes.shape[0], context.shape[0]))
        self.finals += final

    def send_error(self, message, code):
        self.errors.append((code, message))
        self.finals += 1

    def send_final(self):
        self.finals += 1

    def is_cancelled(self):
        self.checks += 1
        return self.cancel_after is not None and self.checks > self.cancel_after


def run(chunks, stream=True, wants_audio=True, client=None, cancel_poll_s=0.0, **kwargs):
    """The fake's chunks come all at once: the client is asked at every one unless `cancel_poll_s`."""
    children, client = FakeChildren(chunks, **kwargs), client or FakeClient()
    SpeechStream(children, client, stream=stream, wants_audio=wants_audio, cancel_poll_s=cancel_poll_s).run()
    return children, client


def test_the_vocoder_sequence_is_ended_before_the_final_response():
    # A client sending its next request on the final response must find the slot already free.
    children = FakeChildren([CodesChunk(codes(2), EMPTY)])
    client = FakeClient()
    client.send_final = lambda: client.sent.append(("final", list(children.vocoder_calls)))
    SpeechStream(children, client, stream=True, wants_audio=True).run()
    assert client.sent[-1] == ("final", [(2, True, False), (0, False, True)])


@pytest.mark.parametrize("context", [False, True])
def test_a_failed_start_still_ends_the_sequence_and_the_client_gets_one_final_error(context):
    # Triton's sequence batcher holds a slot from the START flag on, even when that call fails.
    ctx = codes(3) if context else EMPTY
    children = FakeChildren([CodesChunk(codes(2), ctx), CodesChunk(codes(5, 2), EMPTY)])
    children.fail_start = True
    client = FakeClient()
    SpeechStream(children, client, stream=True, wants_audio=True).run()
    assert client.finals == 1 and [code for code, _ in client.errors] == [ErrorKind.UNAVAILABLE]
    start = (3, True, False) if context else (2, True, False)
    assert children.vocoder_calls == [start, (0, False, True)]


def test_offline_vocodes_in_one_call_that_starts_and_ends_the_sequence():
    children, client = run([CodesChunk(codes(2), EMPTY), CodesChunk(codes(3, 2), EMPTY)], stream=False)
    assert children.vocoder_calls == [(5, True, True)] and client.sent == [(5, 5, 0)] and client.finals == 1


def test_streaming_sends_each_chunk_then_one_final():
    children, client = run([CodesChunk(codes(2), EMPTY), CodesChunk(codes(5, 2), EMPTY)])
    assert client.sent == [(2, 2, 0), (5, 5, 0)] and client.finals == 1 and not client.errors
    # START rides on the first chunk; END goes before the final response.
    assert children.vocoder_calls == [(2, True, False), (5, False, False), (0, False, True)]


def test_codes_only_never_calls_the_vocoder():
    children, client = run([CodesChunk(codes(2), EMPTY), CodesChunk(codes(3), EMPTY)], wants_audio=False)
    assert client.sent == [(None, 2, 0), (None, 3, 0)] and client.finals == 1
    assert children.vocoder_calls == []


def test_idle_ticks_check_cancellation_and_are_not_sent():
    client = FakeClient(cancel_after=2)
    children, client = run([None, None, None, CodesChunk(codes(2), EMPTY)], client=client)
    assert client.checks == 3 and client.sent == [] and client.errors[0][0] is ErrorKind.CANCELLED
    assert children.log == ["aborted", "closed"]  # the engine is aborted before its stream is closed


def test_non_streaming_is_one_response_and_continuation_primes():
    children, client = run([CodesChunk(EMPTY, codes(3, 100)), CodesChunk(codes(2), EMPTY),
                            CodesChunk(codes(4), EMPTY)], stream=False)
    assert client.sent == [(6, 6, 3)] and client.finals == 1
    assert children.vocoder_calls == [(3, True, False), (6, False, True)]  # prime, then all codes + END


def test_streaming_continuation_sends_context_once():
    children, client = run([CodesChunk(EMPTY, codes(3, 100)), CodesChunk(codes(2), EMPTY), CodesChunk(codes(1), EMPTY)])
    assert client.sent == [(2, 2, 3), (1, 1, 0)]
    assert children.vocoder_calls[0] == (3, True, False)


@pytest.mark.parametrize("wants_audio", [True, False])
def test_continuation_that_stops_at_once_still_sends_its_context(wants_audio):
    children, client = run([CodesChunk(EMPTY, codes(3, 100))], wants_audio=wants_audio)
    assert client.sent == [(0 if wants_audio else None, 0, 3)] and client.finals == 1
    assert children.vocoder_calls == []


def test_cancel_aborts_engine_and_ends_vocoder():
    children, client = run([CodesChunk(codes(1, i), EMPTY) for i in range(10)], client=FakeClient(cancel_after=2))
    assert children.log == ["aborted", "closed"]
    assert client.finals == 1 and client.errors[0][0] is ErrorKind.CANCELLED
    assert children.vocoder_calls[-1] == (0, False, True)  # the sequence was ended
    assert len(client.sent) == 2


def test_shutdown_ends_the_stream_with_unavailable():
    children, client = FakeChildren([CodesChunk(codes(1), EMPTY)] * 5), FakeClient()
    stopping = iter([False, True])
    SpeechStream(children, client, stream=True, is_stopping=lambda: next(stopping, True)).run()
    assert client.errors[0][0] is ErrorKind.UNAVAILABLE and "shutting down" in client.errors[0][1]
    assert children.log == ["aborted", "closed"] and client.finals == 1


def test_child_error_becomes_one_final_error_and_closes_vocoder():
    children, client = run([CodesChunk(codes(2), EMPTY), CodesChunk(codes(2), EMPTY)], fail_after=1)
    assert client.finals == 1 and client.errors == [(ErrorKind.INVALID_ARGUMENT, "[INVALID_ARGUMENT] reference audio could not be decoded")]
    assert children.vocoder_calls[-1] == (0, False, True)


def test_unexpected_exception_is_one_internal_error():
    class Broken(FakeChildren):
        def vocode(self, c, start, end, deadline=None):
            raise RuntimeError("boom")
    children, client = Broken([CodesChunk(codes(2), EMPTY)]), FakeClient()
    SpeechStream(children, client, stream=True).run()
    assert client.finals == 1 and client.errors[0][0] is ErrorKind.INTERNAL and "boom" in client.errors[0][1]


@pytest.mark.parametrize("stream", [True, False])
def test_empty_utterance_still_ends_cleanly(stream):
    children, client = run([], stream=stream)
    assert client.finals == 1 and not client.errors


def test_a_child_refused_at_shutdown_is_unavailable_and_says_so():
    error = ChildError.from_message("Model vocoder - Error when running inference: Server not ready")
    assert error.kind is ErrorKind.UNAVAILABLE and "shutting down" in str(error)
    assert ChildError.from_message("[INVALID_ARGUMENT] bad codes").kind is ErrorKind.INVALID_ARGUMENT


class Later:
    """A vocoder call answered when the test says so (the in-process worker's VocodeJob)."""

    def __init__(self, audio, error=None):
        self.audio, self.error, self.is_done, self.is_cancelled = audio, error, False, False
        self.is_hurried = False

    def done(self):
        return self.is_done

    def wait(self, timeout=None):
        self.is_done = True  # a blocking wait: the worker answers it
        return True

    def result(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.audio

    def cancel(self):
        self.is_cancelled = True

    def hurry(self):
        self.is_hurried = not self.is_done


class AsyncChildren(FakeChildren):
    """Vocoder calls in flight: each is answered once the next engine chunk has come."""

    def __init__(self, chunks, error_at=None):
        super().__init__(chunks)
        self.pending, self.error_at, self.deadlines = [], error_at, []

    def stream_codes(self):
        for chunk in super().stream_codes():
            answered = list(self.pending)  # submitted before this chunk: answered after it (a round)
            yield chunk
            for p in answered:
                p.is_done = True
            if answered:
                yield AUDIO_READY

    def vocode(self, c, start, end, deadline=None):
        self.vocoder_calls.append((c.shape[0], start, end))
        self.deadlines.append(deadline)
        self.log.append(("vocode", c.shape[0], end))
        error = None
        if self.error_at is not None and len(self.vocoder_calls) - 1 == self.error_at:
            error = ChildError("[INTERNAL] vocoder decode failed", ErrorKind.INTERNAL)
        self.pending.append(Later(np.full((2, c.shape[0] * 4), float(c.shape[0]), np.float32), error))
        return self.pending[-1]


class LoggingClient(FakeClient):
    def __init__(self, log, **kwargs):
        super().__init__(**kwargs)
        self.log = log

    def send(self, audio, codes, context, final):
        self.log.append(("send", codes.shape[0]))
        super().send(audio, codes, context, final)


def test_chunks_go_to_the_vocoder_before_the_audio_before_them_is_back():
    children = AsyncChildren([CodesChunk(codes(n), EMPTY) for n in (2, 4, 8)])
    client = LoggingClient(children.log)
    SpeechStream(children, client, stream=True).run()
    assert client.sent == [(2, 2, 0), (4, 4, 0), (8, 8, 0)] and client.finals == 1 and not client.errors
    # Chunk 2 went in before chunk 1's audio left; END went in behind the last chunk, before
    # that chunk's audio was sent (the vocoder frees the slot as soon as it is decoded).
    assert children.log[:3] == [("vocode", 2, False), ("vocode", 4, False), ("send", 2)]
    assert children.log.index(("vocode", 0, True)) < children.log.index(("send", 8))
    assert children.vocoder_calls == [(2, True, False), (4, False, False), (8, False, False), (0, False, True)]


def test_a_failed_call_in_flight_ends_the_stream_with_its_error_and_drops_the_rest():
    children = AsyncChildren([CodesChunk(codes(n), EMPTY) for n in (2, 4, 8, 10)], error_at=1)
    client = FakeClient()
    SpeechStream(children, client, stream=True).run()
    assert client.sent == [(2, 2, 0)] and client.finals == 1
    assert client.errors == [(ErrorKind.INTERNAL, "[INTERNAL] vocoder decode failed")]
    assert children.vocoder_calls[-1] == (0, False, True)  # the sequence is still ended
    assert all(p.is_cancelled for p in children.pending[2:-1])  # what was still in flight is dropped


def test_a_cancel_drops_the_chunks_in_flight_and_ends_the_sequence():
    children = AsyncChildren([CodesChunk(codes(n), EMPTY) for n in (2, 4, 8, 10)])
    client = FakeClient(cancel_after=2)
    SpeechStream(children, client, stream=True, cancel_poll_s=0).run()
    assert client.finals == 1 and client.errors[0][0] is ErrorKind.CANCELLED
    assert children.vocoder_calls[-1] == (0, False, True)
    assert len(client.sent) < 4


def test_offline_waits_for_its_one_call_and_sends_one_final_response():
    children = AsyncChildren([CodesChunk(EMPTY, codes(3, 100)), CodesChunk(codes(2), EMPTY), CodesChunk(codes(4), EMPTY)])
    client = FakeClient()
    SpeechStream(children, client, stream=False).run()
    assert client.sent == [(6, 6, 3)] and client.finals == 1 and not client.errors
    assert children.vocoder_calls == [(3, True, False), (6, False, True)]  # prime, then all + END, no extra END


def test_each_chunk_is_due_when_the_audio_before_it_has_played_out():
    children = AsyncChildren([CodesChunk(codes(n), EMPTY) for n in (2, 4, 8)])
    SpeechStream(children, FakeClient(), stream=True).run()
    first, second, third, end = children.deadlines
    # Chunk 2 goes in before any audio left: due 2 frames (160 ms) after now; chunk 3 is due
    # 6 frames after playback began (chunk 1's audio was sent in between).
    assert second - first == pytest.approx(0.16, abs=0.05)
    assert third - first == pytest.approx(0.48, abs=0.05)
    assert end is None  # END: due now (it only frees the slot)


@pytest.mark.parametrize("stream", [True, False])
def test_once_its_codes_are_all_in_a_stream_hurries_the_calls_it_waits_for(stream):
    """A held vocoder round would otherwise wait for company while the stream waits to end (a
    text session's sentence has no END behind its last chunk: vocoder/jobs.hold_until)."""
    children = AsyncChildren([CodesChunk(codes(n), EMPTY) for n in (2, 4, 8)])
    SpeechStream(children, FakeClient(), stream=stream).run()
    hurried = [p.is_hurried for p in children.pending]
    # Streamed: the 8-frame chunk was still in flight at the end, the earlier ones answered; the
    # END (no frames) is never held. STREAM=false: its one call.
    assert hurried == ([False, False, True, False] if stream else [True])


class SlowChildren(FakeChildren):
    """Its chunks come `gap_s` apart, as an engine's do."""

    def __init__(self, chunks, gap_s):
        super().__init__(chunks)
        self.gap_s = gap_s

    def stream_codes(self):
        for chunk in super().stream_codes():
            time.sleep(self.gap_s)
            yield chunk


def test_the_client_is_asked_about_a_cancel_at_most_every_poll_interval():
    """Each check is an IPC round trip (issue 34): chunks that come together ask once, an idle
    tick always asks, a chunk after the interval asks again, and a shutdown is seen at once."""
    chunks = [CodesChunk(codes(2, i), EMPTY) for i in range(10)]
    _, client = run(chunks, cancel_poll_s=CANCEL_POLL_S)
    assert client.checks == 1 and len(client.sent) == 10 and client.finals == 1  # the first chunk's
    _, client = run([chunks[0], None, chunks[1], None, chunks[2]], cancel_poll_s=CANCEL_POLL_S)
    assert client.checks == 3  # the first chunk, and each tick
    children = SlowChildren(chunks[:4], gap_s=0.06)
    client = FakeClient()
    SpeechStream(children, client, stream=True, cancel_poll_s=0.05).run()
    assert client.checks == 4
    # a cancel is still found within the interval's reach
    children = SlowChildren(chunks, gap_s=0.06)
    client = FakeClient(cancel_after=2)
    SpeechStream(children, client, stream=True, cancel_poll_s=0.05).run()
    assert client.errors[0][0] is ErrorKind.CANCELLED and len(client.sent) == 2 and children.log == ["aborted", "closed"]
    # the server stopping is a flag, read at every chunk
    stopping = iter([False, False, True])
    client = FakeClient()
    SpeechStream(FakeChildren(chunks), client, stream=True, is_stopping=lambda: next(stopping, True)).run()
    assert client.checks == 1 and len(client.sent) == 2 and client.errors[0][0] is ErrorKind.UNAVAILABLE
