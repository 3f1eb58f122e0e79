"""Playback: when a listener's audio runs out, so each vocoder call can say when its audio is due
(vocoder/jobs.py picks a round's work by that deadline).

The listener starts playing when the first audio is sent and plays the audio in the order it was
handed to the vocoder, so the next chunk is due when everything handed over before it has played:
start + frames * 80 ms. Before the first audio is sent the start is "now": a new stream's first
chunk is due at once.

One Playback per stream, except for a text session, whose requests (one per sentence) are one
audio stream to its listener and share the session's Playback. Why that matters (issue 31): with
a Playback per request, a session's second sentence counted as a listener with nothing buffered,
although the first sentence's seconds of audio were still playing, so its chunks (due "now")
went ahead of new streams' first chunks in the vocoder; the server's first-audio trace of 128
text sessions on the H200 showed first chunks waiting in the vocoder for 5-7 rounds.
If the listener ran dry between two requests (the next sentence's text came late), playback
restarts with that request's first audio, as for a new stream. Requests of one session run one
at a time (sessions/session_request.py), so a session's Playback is used by one thread at a time.
No Triton import.
"""

from __future__ import annotations

import time
from typing import Optional

from ..contract.tensors import SAMPLE_RATE, SAMPLES_PER_FRAME

FRAME_S = SAMPLES_PER_FRAME / SAMPLE_RATE  # seconds of audio per codec frame (0.08)


class Playback:
    def __init__(self) -> None:
        self.start: Optional[float] = None  # time.monotonic() of the first audio sent
        self.frames = 0  # frames handed to the vocoder for this listener since `start`

    def due(self, now: float) -> float:
        """When the next chunk handed to the vocoder is due (time.monotonic())."""
        return (now if self.start is None else self.start) + self.frames * FRAME_S

    def submitted(self, frames: int) -> None:
        self.frames += frames

    def begin(self, now: float) -> None:
        """A request's stream begins: a listener whose audio has run out starts again, as new."""
        if self.start is not None and self.due(now) < now:
            self.start, self.frames = None, 0

    def sent(self, now: float) -> None:
        """Audio was sent: the first sent starts the playback."""
        if self.start is None:
            self.start = now
