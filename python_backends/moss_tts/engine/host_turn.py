"""HostTurn: the engine thread's host phase goes first; the stream threads wait their turn.

In the `moss_tts` stub the engine thread shares one GIL with the vocoder thread and up to ~300
stream threads. Each torch call of a step's launch gives the GIL up, and winning it back goes
round every thread that wants it: under the H200 soak the engine's host time was 18 ms a step
(launch 8.4, apply 8.0) against 5.5 ms of device wait, the GPU half idle (issue 34, round 9's
py-spy record: stream threads held the GIL 48% of the time, the engine 28%). So, with
`EngineConfig.host_turn_ms` > 0:
- the engine's events (code chunks, Finished) are held while it applies a step and launches
  the next, and delivered together just before it waits for the device (`give`), so the stream
  threads they wake run while the engine sleeps instead of preempting it;
- a stream thread about to do its work (a chunk, audio to send, a prompt to tokenize) first
  waits while the engine holds its turn (`give_way`), at most `max_wait_s`, so that a host phase
  that never ends (a CPU-bound engine) delays the streams by at most that, never starves them.
With 0 every event is delivered at once and `give_way` returns at once (the behaviour before).
While it delivers, the process's GIL switch interval is widened to `deliver_interval_s` (when that
is longer): the delivery is pure Python (a queue put per event, the turn's Event set), and the
stream threads it wakes would otherwise preempt it every switch interval (the stub's 0.05 ms), the
engine then waiting to win the GIL back before its next event. In perf/bench_host_turn.py's model
(256 streams, 32 events a step) a give took 2.6-3.1 ms so and 0.3 ms widened to 1 ms (issue 34,
round 16). It makes no call that gives the GIL up unless a lock it takes is held (the feeds' map,
the Event's condition; with `vocoder_forward_chunks` also a stream's forwarder, held by a stream
closing it, and the vocoder worker's condition, held while it plans a round), and then waits for
that holder, which may keep the GIL up to one widened interval.
The vocoder thread and Triton's own threads never wait here. Measured (round 10, one H200): the
soak's engine host time fell from 10.3 to 4.1 ms a step (apply 4.8 -> 1.75), the GPU then the
bound; on two slower hosts it stayed at 17-27 ms with the turn (perf/bench_host_turn.py models why).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Callable, Generic, TypeVar

log = logging.getLogger(__name__)
E = TypeVar("E")


class HostTurn(Generic[E]):
    def __init__(self, on_event: Callable[[E], None], max_wait_s: float, deliver_interval_s: float = 0.0) -> None:
        self.max_wait_s = max_wait_s
        self.is_on = max_wait_s > 0
        self.deliver_interval_s = deliver_interval_s  # 0: the process's interval throughout
        self._on_event = on_event
        self._held: list[E] = []  # engine thread only
        self._given = threading.Event()  # set while the engine is not in its host phase
        self._given.set()

    # ---- engine thread ----

    def post(self, event: E) -> None:
        """An event for the streams: delivered now, or at the next `give` while the turn is on."""
        if self.is_on:
            self._held.append(event)
        else:
            self._deliver(event)

    def take(self) -> None:
        """The engine's host phase begins (its device wait ended)."""
        if self.is_on:
            self._given.clear()

    def give(self) -> None:
        """The engine is about to wait (for the device, a vocoder post, new work): deliver what it
        held, in order, and let the stream threads run."""
        if not self.is_on:
            return
        held, self._held = self._held, []
        interval = sys.getswitchinterval()
        widen = held and self.deliver_interval_s > interval
        if widen:
            sys.setswitchinterval(self.deliver_interval_s)
        try:
            # Open first: a stream thread woken by its event then finds the turn free at once.
            self._given.set()
            for event in held:
                self._deliver(event)
        finally:
            if widen:  # CPython keeps whole µs, cut down: without the half µs each restore loses one
                sys.setswitchinterval(interval + 5e-7)

    def given(self) -> "HostTurn[E]":
        """`with turn.given():` around one of the engine's waits: given before it, taken back
        after. The turn is its own context manager, not a generator one: this runs every step."""
        return self

    def __enter__(self) -> None:
        self.give()

    def __exit__(self, *exc) -> None:
        self.take()

    # ---- stream threads ----

    def give_way(self) -> None:
        """Wait while the engine is in its host phase, at most max_wait_s."""
        if not self._given.is_set():  # a plain attribute read: no lock while the turn is free
            self._given.wait(self.max_wait_s)

    def _deliver(self, event: E) -> None:
        try:
            self._on_event(event)
        except Exception:  # a broken consumer must not stop the engine for everyone else
            log.exception("on_event raised for request %s", getattr(event, "request_id", "?"))
