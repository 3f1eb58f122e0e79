"""FirstAudioTrace: where one request's time to first audio went, inside `moss_tts`, for a
profile of a burst (issue 31: 128 text sessions that complete a sentence in the same instant get
their first audio 200-350 ms later, against 27 ms for one).

Off unless the environment names a file (`MOSS_TTS_FIRST_AUDIO_TRACE`, read once when the model
loads): then every request appends one JSON line when it ends, its moments in ms after execute()
received it:

  thread     its stream thread started it (a session's request: after its turn came)
  queued     it entered the engine's queue (prompt built)
  engine     the engine put its first codes on the request's feed (admission, prefill, first frames)
  read       the stream thread took those codes (and handed them to the vocoder)
  launched   a vocoder round carried them to the GPU (the in-process vocoder's worker thread)
  vocoded    the vocoder finished decoding them (the worker's thread)
  noticed    the stream thread saw that
  sent       the first audio response had left (Triton's send returned)

plus `received` (wall clock, seconds: to line a request up with a client's log), `outcome`
and `session_index` (a text session's request; None otherwise). A moment that did not happen
(no audio, a failure) is absent. Writes go through one lock and a line buffer: a few µs a request,
never on the engine's or the vocoder's thread. No Triton import.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import IO, Optional

log = logging.getLogger(__name__)
ENV = "MOSS_TTS_FIRST_AUDIO_TRACE"
MOMENTS = ("thread", "queued", "engine", "read", "launched", "vocoded", "noticed", "sent")


class FirstAudioTrace:
    """The moments of one request (time.monotonic()), each kept the first time it is marked."""

    def __init__(self, received: float, session_index: Optional[int] = None) -> None:
        self.received = received
        self.received_wall = time.time() - (time.monotonic() - received)
        self.session_index = session_index
        self.moments: dict[str, float] = {}

    def mark(self, moment: str, at: Optional[float] = None) -> None:
        if moment not in self.moments and (at is None or at > 0):
            self.moments[moment] = time.monotonic() if at is None else at

    def codes_read(self, queued_at: float, first_codes_at: float) -> None:
        """The stream thread took codes (the engine's moments came with them)."""
        self.mark("queued", queued_at)
        self.mark("engine", first_codes_at)
        self.mark("read")

    def audio_ready(self, launched_at: float, vocoded_at: float) -> None:
        """The stream thread found decoded audio to send (the vocoder's moments came with it)."""
        self.mark("launched", launched_at)
        self.mark("vocoded", vocoded_at)
        self.mark("noticed")

    def line(self, outcome: str) -> str:
        ms = {m: round((self.moments[m] - self.received) * 1000, 2) for m in MOMENTS if m in self.moments}
        return json.dumps({"received": round(self.received_wall, 4), "outcome": outcome,
                           "session_index": self.session_index, "ms": ms})


class TraceLog:
    """Where the traces go: one file, a line per request, appended under a lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: IO[str] = open(path, "a", buffering=1)

    @classmethod
    def from_env(cls) -> Optional["TraceLog"]:
        path = os.environ.get(ENV, "").strip()
        if not path:
            return None
        log.warning("tracing every request's first audio to %s (%s)", path, ENV)
        return cls(path)

    def write(self, trace: FirstAudioTrace, outcome: str) -> None:
        line = trace.line(outcome)
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()
