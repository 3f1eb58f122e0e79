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


@dataclass(frozen=True)
class LedgerStats:
    entered: int  # requests execute() received
    finals: int  # of them, those whose final flag was sent
    in_flight: int  # entered - finals
    send_errors: int  # sends that raised (the request's stream got the error)
    double_finals: int  # a final flag sent twice for one request: a defect, never expected


class RequestLedger:
    def __init__(self, final_flag: int) -> None:
        self.final_flag = final_flag
        self._lock = threading.Lock()
        self._entered = self._finals = self._send_errors = self._double_finals = 0

    def track(self, sender) -> "TrackedSender":
        """`sender` (a request's response sender) for a request that just entered execute()."""
        with self._lock:
            self._entered += 1
        return TrackedSender(sender, self)

    def stats(self) -> LedgerStats:
        with self._lock:
            return LedgerStats(self._entered, self._finals, self._entered - self._finals, self._send_errors,
                               self._double_finals)

    def _sent(self, sender: "TrackedSender", final: bool, error: bool) -> None:
        with self._lock:
            self._send_errors += error
            if final and not error:
                if sender.is_final_sent:
                    self._double_finals += 1
                else:
                    sender.is_final_sent = True
                    self._finals += 1


class TrackedSender:
    """A response sender that reports its final flag to the ledger (same send/is_cancelled)."""

    def __init__(self, sender, ledger: RequestLedger) -> None:
        self.sender, self.ledger = sender, ledger
        self.is_final_sent = False

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
