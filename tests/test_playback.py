"""When each vocoder call is due (pipeline/playback.py): a stream's chunks by its listener's clock,
and a text session's requests by one clock, the session's (issue 31: a later sentence's chunks
were due "now" and went ahead of new streams' first chunks)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from moss_tts.pipeline.playback import FRAME_S, Playback
from moss_tts.pipeline.speech_stream import SpeechStream
from moss_tts.pipeline.stream_ports import CodesChunk, Ready
from test_speech_pipeline import EMPTY, FakeChildren, FakeClient, codes


class DeadlineChildren(FakeChildren):
    def __init__(self, chunks):
        super().__init__(chunks)
        self.deadlines = []  # (frames, deadline - the moment of the call)

    def vocode(self, c, start, end, deadline=None):
        if c.shape[0]:
            self.deadlines.append((c.shape[0], deadline - time.monotonic()))
        return Ready(np.zeros((2, c.shape[0] * 4), np.float32))


def test_the_clock_counts_from_the_first_audio_sent_and_restarts_after_a_gap():
    playback = Playback()
    assert playback.due(100.0) == 100.0  # nothing sent yet: due now
    playback.submitted(2)
    assert playback.due(100.0) == pytest.approx(100.0 + 2 * FRAME_S)
    playback.sent(100.5)
    playback.sent(101.0)  # only the first audio sent starts it
    playback.submitted(10)
    assert playback.start == 100.5 and playback.due(101.0) == pytest.approx(100.5 + 12 * FRAME_S)
    playback.begin(101.0)  # audio left: the clock runs on
    assert playback.frames == 12
    playback.begin(100.5 + 12 * FRAME_S + 0.01)  # the listener ran dry: it starts again, as new
    assert playback.start is None and playback.frames == 0


def test_a_streams_chunks_are_due_when_the_audio_before_them_has_played():
    children = DeadlineChildren([CodesChunk(codes(n), EMPTY) for n in (2, 4, 8)])
    SpeechStream(children, FakeClient(), stream=True).run()
    (f1, d1), (f2, d2), (f3, d3) = children.deadlines
    assert (f1, f2, f3) == (2, 4, 8)
    assert abs(d1) < 0.05  # the first chunk: at once
    assert d2 == pytest.approx(2 * FRAME_S, abs=0.05) and d3 == pytest.approx(6 * FRAME_S, abs=0.05)


def test_a_sessions_later_request_is_due_after_the_earlier_audio_not_at_once():
    playback = Playback()
    first = DeadlineChildren([CodesChunk(codes(n), EMPTY) for n in (2, 4, 8, 16, 10)])
    SpeechStream(first, FakeClient(), stream=True, playback=playback).run()
    later = DeadlineChildren([CodesChunk(codes(2), EMPTY), CodesChunk(codes(4), EMPTY)])
    SpeechStream(later, FakeClient(), stream=True, playback=playback).run()
    # 40 frames (3.2 s) of the first sentence are still to play: the next sentence is due after them.
    assert later.deadlines[0][1] == pytest.approx(40 * FRAME_S, abs=0.05)
    assert later.deadlines[1][1] == pytest.approx(42 * FRAME_S, abs=0.05)
    alone = DeadlineChildren([CodesChunk(codes(2), EMPTY)])
    SpeechStream(alone, FakeClient(), stream=True).run()  # its own clock: due at once
    assert abs(alone.deadlines[0][1]) < 0.05


def test_a_session_whose_listener_ran_dry_starts_again_with_its_next_request():
    playback = Playback()
    SpeechStream(DeadlineChildren([CodesChunk(codes(2), EMPTY)]), FakeClient(), stream=True, playback=playback).run()
    playback.start -= 10.0  # its 2 frames played out long ago (the next text came late)
    later = DeadlineChildren([CodesChunk(codes(2), EMPTY), CodesChunk(codes(4), EMPTY)])
    SpeechStream(later, FakeClient(), stream=True, playback=playback).run()
    assert abs(later.deadlines[0][1]) < 0.05  # due at once, as a new stream's first chunk
    assert later.deadlines[1][1] == pytest.approx(2 * FRAME_S, abs=0.05)  # then by its own playback
