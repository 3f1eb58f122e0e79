"""StallWatch: is a model's work stuck? The basis of its heartbeat (triton_io.Heartbeat).

Each unit of work (an execute call, a response send) runs inside `working()`, from any number
of threads; `stalled_seconds()` is the age of the oldest unit still running, 0 when idle. A
unit that never ends (a deadlock, an IPC peer that died) makes it grow until the heartbeat
stops and readiness turns false. No Triton import.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator


class StallWatch:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}
        self._ids = itertools.count()

    @contextmanager
    def working(self) -> Iterator[None]:
        token = next(self._ids)
        with self._lock:
            self._started[token] = self._clock()
        try:
            yield
        finally:
            with self._lock:
                del self._started[token]

    def stalled_seconds(self) -> float:
        with self._lock:
            oldest = min(self._started.values(), default=None)
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)
