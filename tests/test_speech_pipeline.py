"""The moss_tts entry's policy with fake children and client (no Triton)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from moss_tts.serving.speech_pipeline import ChildError, CodesChunk, SpeechStream

EMPTY = np.zeros((0, 12), np.int32)


def codes(n, start=0):
    return (np.arange(start, start + n)[:, None] + np.zeros((1, 12), np.int64)).astype(np.int32)


class FakeChildren:
    def __init__(self, chunks, fail_after=None):
        self.chunks, self.fail_after = chunks, fail_after
        self.vocoder_calls, self.aborted = [], threading.Event()

    def stream_codes(self):
        for i, chunk in enumerate(self.chunks):
            if self.fail_after is not None and i == self.fail_after:
                raise ChildError("[INVALID_ARGUMENT] reference audio could not be decoded", "invalid")
            yield chunk

    def abort_codes(self):
        self.aborted.set()

    def vocode(self, c, start, end):
        self.vocoder_calls.append((c.shape[0], start, end))
        return np.full((2, c.shape[0] * 4), float(c.shape[0]), np.float32)


class FakeClient:
    def __init__(self, cancel_after=None):
        self.audio, self.finals, self.errors = [], 0, []
        self.cancel_after = cancel_after
        self.checks = 0

    def send_audio(self, audio, final):
        self.audio.append(audio)
        self.finals += final

    def send_error(self, message, code):
        self.errors.append((code, message))
        self.finals += 1

    def send_final(self):
        self.finals += 1

    def is_cancelled(self):
        self.checks += 1
        return self.cancel_after is not None and self.checks > self.cancel_after


def test_streaming_sends_each_chunk_then_one_final():
    children = FakeChildren([CodesChunk(codes(2), EMPTY), CodesChunk(codes(5, 2), EMPTY)])
    client = FakeClient()
    SpeechStream(children, client, stream=True).run()
    assert [a.shape[1] for a in client.audio] == [8, 20] and client.finals == 1 and not client.errors
    assert children.vocoder_calls == [(0, True, False), (2, False, False), (5, False, False), (0, False, True)]


def test_non_streaming_is_one_response_and_continuation_primes():
    children = FakeChildren([CodesChunk(codes(2), codes(3, 100)), CodesChunk(codes(4), EMPTY)])
    client = FakeClient()
    SpeechStream(children, client, stream=False).run()
    assert len(client.audio) == 1 and client.audio[0].shape == (2, 24) and client.finals == 1
    assert children.vocoder_calls == [(3, True, False), (6, False, True)]  # prime, then all codes + END


def test_cancel_aborts_engine_and_ends_vocoder():
    children = FakeChildren([CodesChunk(codes(1, i), EMPTY) for i in range(10)])
    client = FakeClient(cancel_after=2)
    SpeechStream(children, client, stream=True).run()
    assert children.aborted.is_set()
    assert client.finals == 1 and client.errors[0][0] == "cancelled"
    assert children.vocoder_calls[-1] == (0, False, True)  # the sequence was ended
    assert len(client.audio) == 2


def test_child_error_becomes_one_final_error_and_closes_vocoder():
    children = FakeChildren([CodesChunk(codes(2), EMPTY), CodesChunk(codes(2), EMPTY)], fail_after=1)
    client = FakeClient()
    SpeechStream(children, client, stream=True).run()
    assert client.finals == 1 and client.errors == [("invalid", "[INVALID_ARGUMENT] reference audio could not be decoded")]
    assert children.vocoder_calls[-1] == (0, False, True)


@pytest.mark.parametrize("stream", [True, False])
def test_empty_utterance_still_ends_cleanly(stream):
    children = FakeChildren([])
    client = FakeClient()
    SpeechStream(children, client, stream=stream).run()
    assert client.finals == 1 and not client.errors
