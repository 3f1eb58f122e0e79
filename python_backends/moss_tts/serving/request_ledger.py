"""RequestLedger: the requests `moss_tts` received and the final flags it sent, so the model's own
view of what is in flight can be set beside Triton's (issue 20: after a cancel-heavy soak Triton
kept `moss_tts` loaded although every stream had ended; this says whether the model agrees).

execute() wraps each request's response sender in `track()`; every response of that request
leaves through the wrapper, which counts the request's final flag once it is sent (a second final
is a defect, counted apart). in_flight = entered - finals: 0 whenever the model holds no request.
No Triton import (the final flag's value is passed in).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


# What a request is, once execute() has read it: refused (invalid input, busy: answered in
# execute), streamed audio, STREAM=false, codes only (no AUDIO asked for), long-form (several
# segments). Until then it counts as "unread".
PATHS = ("unread", "refused", "stream", "offline", "codes", "long_form")


@dataclass(frozen=True)
class LedgerStats:
    entered: int  # requests execute() received
    finals: int  # of them, those whose final flag was sent
    in_flight: int  # entered - finals
    send_errors: int  # sends that raised (the request's stream got the error)
    double_finals: int  # a final flag sent twice for one request: a defect, never expected
    # in flight per path (PATHS): where a request the model still holds came from
    in_flight_unread: int = 0
    in_flight_refused: int = 0
    in_flight_stream: int = 0
    in_flight_offline: int = 0
    in_flight_codes: int = 0
    in_flight_long_form: int = 0


class RequestLedger:
    def __init__(self, final_flag: int) -> None:
        self.final_flag = final_flag
        self._lock = threading.Lock()
        self._entered = self._finals = self._send_errors = self._double_finals = 0
        self._in_flight = dict.fromkeys(PATHS, 0)

    def track(self, sender) -> "TrackedSender":
        """`sender` (a request's response sender) for a request that just entered execute()."""
        with self._lock:
            self._entered += 1
            self._in_flight["unread"] += 1
        return TrackedSender(sender, self)

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
                               self._double_finals, *(self._in_flight[p] for p in PATHS))

    def _sent(self, sender: "TrackedSender", final: bool, error: bool) -> None:
        with self._lock:
            self._send_errors += error
            if final and not error:
                if sender.is_final_sent:
                    self._double_finals += 1
                else:
                    sender.is_final_sent = True
                    self._finals += 1
                    self._in_flight[sender.path] -= 1


class TrackedSender:
    """A response sender that reports its final flag to the ledger (same send/is_cancelled)."""

    def __init__(self, sender, ledger: RequestLedger) -> None:
        self.sender, self.ledger = sender, ledger
        self.is_final_sent = False
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
        return self.sender.is_cancelled()
