"""StreamPool: runs up to `max_streams` streams at once, each on a daemon thread of one process.

The `moss_tts` entry is decoupled: execute() only validates and hands each stream to this pool,
so one stub process holds hundreds of streams (a stream mostly waits on IPC with the GIL
released) instead of one process per stream. There is no queue here: a stream beyond capacity
is refused at once and the adapter answers UNAVAILABLE (the engine behind it has its own bounded
queue). `stop()` refuses new streams and waits for the running ones, which watch `is_stopping`.
Daemon threads (a stream still blocked in a BLS call when the stub exits, its child maybe gone,
must not hold the exit, and Python waits for every non-daemon thread at interpreter exit, a
ThreadPoolExecutor's too), kept after their stream and reused: starting a thread waits until it
runs, and under load that wait for the GIL cost execute() ~1.4 ms a request (12% of its thread's
time in the H200 soak), during which no new request was read. A new thread is started only when
no idle one is left, so at most `max_streams` ever exist.
No Triton import.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Callable

log = logging.getLogger(__name__)


class StreamPool:
    def __init__(self, max_streams: int, name: str = "moss-tts-stream") -> None:
        if not isinstance(max_streams, int) or isinstance(max_streams, bool) or max_streams < 1:
            raise ValueError(f"max_streams must be a positive integer, got {max_streams!r}")
        self.max_streams = max_streams
        self._name = name
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._num_active = 0
        self._num_idle = 0  # threads that finished a stream and wait on _handoff for the next
        self._handoff: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._is_stopping = False

    @property
    def num_active(self) -> int:
        with self._lock:
            return self._num_active

    def is_stopping(self) -> bool:
        return self._is_stopping

    def refusal(self) -> str:
        """What a request that try_start() turned away is told (UNAVAILABLE)."""
        reason = "is shutting down" if self._is_stopping else f"is busy: {self.max_streams} streams"
        return f"server {reason}; retry later"

    def try_start(self, run: Callable[[], None]) -> bool:
        """Run `run` on a thread of the pool; False (nothing started) at capacity or after stop()."""
        with self._lock:
            if self._is_stopping or self._num_active >= self.max_streams:
                return False
            self._num_active += 1
            reuse = self._num_idle > 0
            if reuse:
                self._num_idle -= 1  # each put below is taken by exactly one idle thread
        if reuse:
            self._handoff.put(run)
            return True
        try:
            threading.Thread(target=self._serve, args=(run,), name=f"{self._name}_{next(self._ids)}",
                             daemon=True).start()
        except BaseException:
            self._done(idle=False)
            raise
        return True

    def _serve(self, run: Callable[[], None]) -> None:
        """A pool thread: its first stream, then whatever try_start hands to an idle thread."""
        while True:
            try:
                run()
            except BaseException:  # a stream's own code guarantees its final response; this is a bug
                log.exception("a stream ended with an exception")
            finally:
                self._done(idle=True)
            run = self._handoff.get()

    def _done(self, idle: bool) -> None:
        with self._lock:
            self._num_active -= 1
            self._num_idle += idle
            self._lock.notify_all()

    def begin_stop(self) -> None:
        """Refuse new streams; the running ones end at their next look at `is_stopping`."""
        with self._lock:
            self._is_stopping = True

    def stop(self, timeout: float) -> bool:
        """Refuse new streams, wait up to `timeout` s for the running ones; True if all ended."""
        with self._lock:
            self._is_stopping = True
            return self._lock.wait_for(lambda: self._num_active == 0, timeout)
