"""IteratorKeeper: who drops a finished decoupled-BLS response iterator, and when.

Why it exists (Triton 24.10 python backend stub, r24.10 sources; fixed upstream only partly):
when a decoupled BLS iterator yields its final response, the stub queues a cleanup message for
its single stub-to-parent thread, which then erases the iterator from a map. Whoever drops the
last reference destroys the received responses and the numpy arrays in their tensors. If that
is the stub's thread, it does so without the GIL (PbTensor's destructor takes the GIL only from
PB PR #390, Dec 2024), while our threads run Python: "free(): invalid pointer", "double free or
corruption" and dead stubs under load.

The cure is an ordering guarantee: is_cancelled() is served by that same thread, in order. So an
is_cancelled() round trip that starts after an iterator was retired (its cleanup already queued)
and has returned proves that the stub's reference is gone; from then on the iterator is ours
alone and dropping it (with the GIL, on our thread) is safe. `retire()` parks finished
iterators; `probe()` wraps the per-chunk cancellation check and drops what it proves safe.

A probe counts only if it is a real round trip: the stub caches is_cancelled() once it returned
True, so a caller must stop probing through a sender it has seen cancelled. Parked iterators of
a cancelled stream wait for the next probe of any other stream (a few KB each). No Triton import.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable


class IteratorKeeper:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parked: deque[tuple[int, Any]] = deque()
        self._ticket = 0

    def _next_ticket(self) -> int:
        with self._lock:
            self._ticket += 1
            return self._ticket

    def retire(self, iterator: Any) -> None:
        """Park an iterator that has yielded its final response (its cleanup is queued)."""
        with self._lock:
            self._ticket += 1
            self._parked.append((self._ticket, iterator))

    def probe(self, is_cancelled: Callable[[], bool]) -> bool:
        """One is_cancelled() round trip; everything parked before it started is then dropped."""
        started = self._next_ticket()
        cancelled = is_cancelled()
        released = []
        with self._lock:
            while self._parked and self._parked[0][0] < started:
                released.append(self._parked.popleft()[1])
        del released  # the last references, dropped here on our thread, with the GIL, outside the lock
        return cancelled

    @property
    def num_parked(self) -> int:
        with self._lock:
            return len(self._parked)
