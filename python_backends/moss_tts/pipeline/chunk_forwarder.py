"""ChunkForwarder: a streamed request's code chunks handed to its vocoder sequence by the thread
that delivers them (the engine's, in its host turn), not by the request's own stream thread.

Why (issue 34, round 16): a chunk costs its stream thread two wake-ups, one to hand the chunk to
the vocoder and one to send its audio. At a wave of 256 new streams every wake-up is a thread
that must win the stub's GIL, while the engine waits for it too: in perf/bench_wave.py's model a
first chunk reached the vocoder 4-14 ms after the engine delivered it (p50; p95 12-30 ms). The
engine delivers its held events while the device works (host_turn.py, under a widened switch
interval), so handing a chunk to the in-process vocoder there is one `VocoderWorker.submit` more
per chunk on a thread that is about to sleep, and the stream thread wakes only to send.

The contract with the stream (SpeechStream) is the lock and one rule: a chunk the forwarder
declines goes to the stream's queue as before, and once it declines one it declines every later
one. So the stream thread hands a chunk to the vocoder itself only after the forwarder has closed,
never beside it, and in the engine's order. The stream closes the forwarder before it ends its
vocoder sequence or drops its calls in flight (close() returns once a forward in progress is
done), and the forwarder closes itself when a hand-over raises (the stream then meets the same
error on its own thread and ends the request the usual way). No Triton import.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)


class ChunkForwarder:
    def __init__(self, take: Callable[[np.ndarray], None]) -> None:
        self._take = take  # SpeechStream's hand-over of one chunk's codes to its vocoder sequence
        self._lock = threading.Lock()
        self._is_open = True
        # Chunks handed over here: tests read it (the server's counter is EngineStreams.chunks_forwarded).
        self.forwarded = 0

    def __call__(self, chunk) -> bool:
        """The delivering thread: True if `chunk` was handed to the vocoder here, False if the
        stream's queue should take it. Never raises: the engine's thread must go on."""
        with self._lock:
            if not self._is_open:
                return False
            try:
                self._take(chunk.codes)
            except Exception as exc:  # the stream meets it again with this chunk, on its own thread
                self._is_open = False
                self._take = None
                log.debug("forwarding a chunk of %s failed, the stream takes it: %s",
                          getattr(chunk, "request_id", "?"), exc)
                return False
            self.forwarded += 1
            return True

    def close(self) -> None:
        """The stream thread: no chunk is handed over here once this returns. It also lets go of the
        stream: stream -> children -> codes -> this -> stream would be a reference cycle, freed only
        by a collection, with the stream's Triton response sender in it (its destructor talks to
        tritonserver, on whichever thread the collection runs)."""
        with self._lock:
            self._is_open = False
            self._take = None

    @property
    def is_open(self) -> bool:
        return self._is_open
