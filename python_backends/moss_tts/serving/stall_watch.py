"""StallWatch: is a model's work stuck? The basis of its heartbeat (triton_io.Heartbeat).

Each unit of work (an execute call, a response send) runs inside `working()`, from any number
of threads; `oldest()` is the age (and name) of the oldest unit still running, 0 when idle. A
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

    __slots__ = ("_watch", "_token", "_what")

    def __init__(self, watch: "StallWatch", what: str) -> None:
        self._watch = watch
        self._token = next(watch._ids)
        self._what = what

    def __enter__(self) -> None:
        self._watch._started[self._token] = (self._watch._clock(), self._what)

    def __exit__(self, *exc) -> None:
        self._watch._started.pop(self._token, None)


class StallWatch:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Written and read without a lock: next() of a count, a dict's item set and pop, and the
        # list of its values are each one step under CPython's GIL (no Python code runs inside
        # them), so concurrent units never see a half-made entry.
        self._started: dict[int, tuple[float, str]] = {}
        self._ids = itertools.count()

    def working(self, what: str = "work") -> _Unit:
        """A unit of work named `what` (a response send, a BLS call to ...): the name is what the
        heartbeat's log says stalled, so a wedge found in a long run says where it waits."""
        return _Unit(self, what)

    def oldest(self) -> tuple[float, str]:
        """(age in seconds, name) of the oldest unit still running; (0.0, "") when idle."""
        oldest = min(list(self._started.values()), default=None)
        return (0.0, "") if oldest is None else (max(0.0, self._clock() - oldest[0]), oldest[1])


def oldest_of(*parts: tuple[float, str]) -> tuple[float, str]:
    """The oldest of several (seconds, name) units of work (StallWatch.oldest, an engine step's
    age, a vocoder round's): what a model's heartbeat stops on, and names."""
    return max(parts, key=lambda part: part[0])
