"""State that test threads share, behind one lock each: the one pattern for a test helper that a
thread writes while another reads (an engine's event thread, a server's stream threads, a test
waiting on them).

A plain `defaultdict(threading.Event)` is not that: two threads that ask for a missing key at once
can each make an Event, one of which is dropped, and a waiter holding the dropped one waits
forever (a CI run: "request bad-prefill never finished" after 120 s, the engine done long before).

A flag one thread flips while others read it is a threading.Event. A result that one thread writes
and the test reads only once the writer has signalled, after the write, that it is done (the test
joined it, waited on an Event it set, or got the response it sent) needs none of these: the signal
orders the two.
"""

from __future__ import annotations

import threading
from typing import Generic, Hashable, TypeVar

T = TypeVar("T")


class EventsByKey:
    """One threading.Event per key, made on first use by whichever thread asks first; every thread
    that asks for a key gets the same Event."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[Hashable, threading.Event] = {}

    def __getitem__(self, key: Hashable) -> threading.Event:
        with self._lock:
            event = self._events.get(key)
            if event is None:
                event = self._events[key] = threading.Event()
            return event


class SharedList(Generic[T]):
    """A list one thread appends to while another reads: append() and snapshot() (a copy) under a
    lock, so no reader walks a list that grows under it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[T] = []

    def append(self, item: T) -> None:
        with self._lock:
            self._items.append(item)

    def snapshot(self) -> list[T]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class SharedCounter:
    """A count that several threads add to while another reads it: add() returns the new count
    under the lock, so no add is lost and no two adds see the same count (a bare `self.calls += 1`
    is a read, an add and a write, and a thread switch between them loses one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self) -> int:
        with self._lock:
            self._count += 1
            return self._count

    def value(self) -> int:
        with self._lock:
            return self._count

    def reset(self) -> None:
        with self._lock:
            self._count = 0
