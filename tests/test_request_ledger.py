"""RequestLedger: in flight = requests entered - final flags sent, per request once."""

from __future__ import annotations

import pytest

from moss_tts.serving.request_ledger import PATHS, RequestLedger

FINAL = 1


class Sender:
    def __init__(self, fail: bool = False) -> None:
        self.sent, self.fail = [], fail

    def send(self, response=None, flags=0):
        if self.fail:
            raise RuntimeError("closed")
        self.sent.append((response, flags))

    def is_cancelled(self):
        return False


def test_in_flight_counts_requests_until_their_final_flag():
    ledger = RequestLedger(FINAL)
    a, b = ledger.track(Sender()), ledger.track(Sender())
    a.send("chunk")
    assert ledger.stats().in_flight == 2
    a.send(flags=FINAL)
    b.send("last", flags=FINAL)
    stats = ledger.stats()
    assert (stats.entered, stats.finals, stats.in_flight, stats.double_finals) == (2, 2, 0, 0)
    b.send(flags=FINAL)  # a defect: counted apart, the request still counts once
    assert (ledger.stats().finals, ledger.stats().double_finals) == (2, 1)


def test_a_final_that_could_not_be_sent_leaves_the_request_in_flight():
    ledger = RequestLedger(FINAL)
    sender = ledger.track(Sender(fail=True))
    with pytest.raises(RuntimeError):
        sender.send(flags=FINAL)
    stats = ledger.stats()
    assert (stats.in_flight, stats.send_errors) == (1, 1)


def test_in_flight_per_path_follows_each_request_to_its_final():
    ledger = RequestLedger(FINAL)
    a, b, c = (ledger.track(Sender()) for _ in range(3))
    assert ledger.stats().in_flight_unread == 3
    ledger.classify(a, "stream")
    ledger.classify(b, "refused")
    b.send("error", flags=FINAL)
    stats = ledger.stats()
    assert (stats.in_flight_unread, stats.in_flight_stream, stats.in_flight_refused) == (1, 1, 0)
    ledger.classify(c, "long_form")
    a.send(flags=FINAL)
    c.send(flags=FINAL)
    stats = ledger.stats()
    assert stats.in_flight == 0 and all(getattr(stats, f"in_flight_{p}") == 0 for p in PATHS)
    with pytest.raises(ValueError):
        ledger.classify(a, "teleport")
