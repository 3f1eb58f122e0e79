"""State that test threads share, behind one lock each: the one pattern for a test helper that a
thread writes while another reads (an engine's event thread, a server's stream threads, a test
waiting on them).

A plain `defaultdict(threading.Event)` is not that: two threads that ask for a missing key at once
can each make an Event, one of which is dropped, and a waiter holding the dropped one waits
forever (a CI run: "request bad-prefill never finished" after 120 s, the engine done long before).
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
