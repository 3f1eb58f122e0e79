"""StallWatch: is a model's work stuck? The basis of its heartbeat (triton_io.Heartbeat).

Each unit of work (an execute call, a response send) runs inside `working()`, from any number
of threads; `stalled_seconds()` is the age of the oldest unit still running, 0 when idle. A
unit that never ends (a deadlock, an IPC peer that died) makes it grow until the heartbeat
stops and readiness turns false. No Triton import.
"""

from __future__ import annotations

import itertools
import time
from typing import Callable


class _Unit:
    """One unit of work inside `StallWatch.working()`: a class, not a generator context manager,
    and no lock, because every response send of every stream runs inside one (~1,000 a second
    at 256 streams, each on the stub's one GIL)."""

    __slots__ = ("_watch", "_token")

    def __init__(self, watch: "StallWatch") -> None:
        self._watch = watch
        self._token = next(watch._ids)

    def __enter__(self) -> None:
        self._watch._started[self._token] = self._watch._clock()

    def __exit__(self, *exc) -> None:
        self._watch._started.pop(self._token, None)


class StallWatch:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Written and read without a lock: next() of a count, a dict's item set and pop, and the
        # list of its values are each one step under CPython's GIL (no Python code runs inside
        # them), so concurrent units never see a half-made entry.
        self._started: dict[int, float] = {}
        self._ids = itertools.count()

    def working(self) -> _Unit:
        return _Unit(self)

    def stalled_seconds(self) -> float:
        oldest = min(list(self._started.values()), default=None)
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)
