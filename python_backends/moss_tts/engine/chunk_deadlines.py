"""ChunkDeadlines: a chunk that would reach its listener too late at its size leaves early.

A stream's chunks grow (request.chunk_target: 2, 4, 8, 16, 25 frames) on the assumption that
a step takes well under a frame's 80 ms: chunk k's frames are made while the audio sent before
it plays. While a wave of ~256 streams is admitted the H200's steps took 30-44 ms (issue 34,
rounds 13-14), so the second chunk's 4 frames took longer than the first chunk's 160 ms of audio,
and 8-37% of the streams at 256 had a gap there. With EngineConfig.chunk_deadline_ms > 0, after
each step the engine sends what a stream has, as a smaller chunk, when waiting one more step (as
long as this one was) would send it later than the deadline before the listener's audio runs out
(counted from when the stream's first chunk left, RequestState.flush_at), while the listener
still has audio: once it has run out, the engine is slower than real time there and smaller chunks
only cost more chunks. A request sends at most MAX_EARLY_CHUNKS chunks early: a wave's start needs
its second to fourth chunks early, and an engine near real time (steps of ~80 ms) would otherwise
send one frame a chunk for as long as it stays there, each a vocoder job and a stream wake-up. The
per-row check runs only with deadlines on (a pass over the step's requests); off, nothing here runs.
"""

from __future__ import annotations

import time
from typing import Callable

from .events import CodesChunk
from .request import RequestState

MAX_STEP_S = 0.25  # the longest next step reckoned with (the first step after the engine idled)
MAX_EARLY_CHUNKS = 3  # per request (module docstring)


class ChunkDeadlines:
    """Engine thread only."""

    def __init__(self) -> None:
        self._last = 0.0  # monotonic end of the previous step's frames

    def flush(self, states: list[RequestState], emit: Callable[[CodesChunk], None]) -> None:
        """After a step's frames are applied: emit the chunk of every running request whose
        deadline falls before the next step's expected end, while its listener still has audio
        (a step longer than the last can carry now past the deadline itself)."""
        now = time.monotonic()
        horizon = now + min(now - self._last, MAX_STEP_S)
        self._last = now
        for state in states:
            if (state.is_running and state.pending and state.early_chunks < MAX_EARLY_CHUNKS
                    and state.flush_at <= horizon and now < state.flush_at + state.deadline_s):
                state.early_chunks += 1
                emit(state.take_chunk(now))
