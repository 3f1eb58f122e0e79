"""RequestLedger: the requests `moss_tts` received and the final flags it sent, so the model's own
view of what is in flight can be set beside Triton's (issue 20: after a cancel-heavy soak Triton
kept `moss_tts` loaded although every stream had ended; this says whether the model agrees).

execute() wraps each request's response sender in `track()`; every response of that request
leaves through the wrapper, which counts the request's final flag once it is sent (a second final
is a defect, counted apart). in_flight = entered - finals: 0 whenever the model holds no request.
No Triton import (the final flag's value is passed in).

It also finds a running request by its id, for an in-band STOP (a later request on the client's
stream naming it): `stop(id)` marks the request's sender stopped, and the stream sees that as its
client's cancel at its next check. Why not the client's gRPC cancel: tritonserver 2.51's stream
handler races a cancel against a response being sent, and the race has wedged (issue 34, round 18)
and crashed (round 19, perf/hold_repro/lock_jitter.c) the server; a stop is an ordinary request.
A request leaves the index with its final flag, under the same lock as a stop, so a stop never
marks a request that has ended.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable


# What a request is, once execute() has read it: refused (invalid input, busy: answered in
# execute), streamed audio, STREAM=false, codes only (no AUDIO asked for), long-form (several
# segments), an in-band STOP. Until then it counts as "unread".
PATHS = ("unread", "refused", "stream", "offline", "codes", "long_form", "stop")


@dataclass(frozen=True)
class LedgerStats:
    entered: int  # requests execute() received
    finals: int  # of them, those whose final flag was sent
    in_flight: int  # entered - finals
    send_errors: int  # sends that raised (the request's stream got the error)
    double_finals: int  # a final flag sent twice for one request: a defect, never expected
    stopped: int = 0  # requests ended by an in-band STOP (before their final flag)
    # in flight per path (PATHS): where a request the model still holds came from
    in_flight_unread: int = 0
    in_flight_refused: int = 0
    in_flight_stream: int = 0
    in_flight_offline: int = 0
    in_flight_codes: int = 0
    in_flight_long_form: int = 0
    in_flight_stop: int = 0


class RequestLedger:
    def __init__(self, final_flag: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.final_flag = final_flag
        self._clock = clock
        self._early_stops: dict[str, float] = {}  # STOPs that came before their request: id -> until
        self._lock = threading.Lock()
        self._entered = self._finals = self._send_errors = self._double_finals = 0
        self._in_flight = dict.fromkeys(PATHS, 0)
        self._stopped = 0
        self._running: dict[str, set[TrackedSender]] = {}  # by request id, until the final flag

    def track(self, sender, request_id: str = "") -> "TrackedSender":
        """`sender` (a request's response sender) for a request that just entered execute(); with
        its request id, a STOP naming that id finds it until its final flag is sent."""
        tracked = TrackedSender(sender, self, request_id)
        with self._lock:
            self._entered += 1
            self._in_flight["unread"] += 1
            if request_id:
                self._running.setdefault(request_id, set()).add(tracked)
                if self._early_stops:
                    now = self._clock()
                    self._early_stops = {i: t for i, t in self._early_stops.items() if t > now}
                    if self._early_stops.pop(request_id, None) is not None:
                        tracked.is_stopped = True
                        self._stopped += 1
        return tracked

    def stop(self, request_id: str, by: "TrackedSender | None" = None, remember_s: float = 0.0) -> int:
        """Mark every running request with this id (but `by`, the STOP request itself) stopped: its
        sender reads as cancelled from now on. Returns how many were running. With `remember_s`, a
        STOP that found nothing also marks a request of that id tracked within that many seconds
        (several instances: Triton may run the STOP on one before the request reaches another's
        execute(); with one instance a stream's requests are executed in order, so it is not needed,
        and an id a careless client reuses is not stopped by an old STOP)."""
        with self._lock:
            found = [t for t in self._running.get(request_id, ()) if t is not by and not t.is_stopped]
            for tracked in found:
                tracked.is_stopped = True
            self._stopped += len(found)
            if not found and remember_s > 0:
                self._early_stops[request_id] = self._clock() + remember_s
        return len(found)

    def classify(self, sender: "TrackedSender", path: str) -> None:
        """What the request turned out to be (one of PATHS); before its final flag, once."""
        if path not in PATHS:
            raise ValueError(f"unknown request path {path!r}; one of {PATHS}")
        with self._lock:
            if not sender.is_final_sent:
                self._in_flight[sender.path] -= 1
                self._in_flight[path] += 1
            sender.path = path

    def stats(self) -> LedgerStats:
        with self._lock:
            return LedgerStats(self._entered, self._finals, self._entered - self._finals, self._send_errors,
                               self._double_finals, self._stopped, *(self._in_flight[p] for p in PATHS))

    def _sent(self, sender: "TrackedSender", final: bool, error: bool) -> None:
        with self._lock:
            self._send_errors += error
            if final:  # sent or not, the request is over for a STOP (a failed final is its end too)
                running = self._running.get(sender.request_id)
                if running is not None:
                    running.discard(sender)
                    if not running:
                        del self._running[sender.request_id]
            if final and not error:
                if sender.is_final_sent:
                    self._double_finals += 1
                else:
                    sender.is_final_sent = True
                    self._finals += 1
                    self._in_flight[sender.path] -= 1

    def running_ids(self) -> int:
        """How many request ids a STOP could find now (0 when nothing is in flight)."""
        with self._lock:
            return len(self._running)


class TrackedSender:
    """A response sender that reports its final flag to the ledger (same send/is_cancelled; a
    stopped request reads as cancelled)."""

    def __init__(self, sender, ledger: RequestLedger, request_id: str = "") -> None:
        self.sender, self.ledger, self.request_id = sender, ledger, request_id
        self.is_final_sent = False
        self.is_stopped = False  # set by RequestLedger.stop, under its lock; never cleared
        self.path = "unread"

    def send(self, response=None, flags: int = 0) -> None:
        final = bool(flags & self.ledger.final_flag)
        try:
            if response is None:
                self.sender.send(flags=flags)
            else:
                self.sender.send(response, flags=flags)
        except BaseException:
            self.ledger._sent(self, final, error=True)
            raise
        self.ledger._sent(self, final, error=False)

    def is_cancelled(self) -> bool:
        return self.is_stopped or self.sender.is_cancelled()
