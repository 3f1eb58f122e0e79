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


def test_a_stop_marks_the_running_requests_of_its_id_and_nothing_else():
    ledger = RequestLedger(FINAL)
    a, twin, other = ledger.track(Sender(), "r1"), ledger.track(Sender(), "r1"), ledger.track(Sender(), "r2")
    stop = ledger.track(Sender(), "r1")  # a STOP that reuses its target's id is never its own target
    assert ledger.stop("r1", by=stop) == 2
    assert a.is_cancelled() and twin.is_cancelled() and not other.is_cancelled() and not stop.is_cancelled()
    assert ledger.stop("r1", by=stop) == 0  # marked once; counted once
    assert ledger.stop("nobody") == 0 and ledger.stats().stopped == 2


def test_a_request_leaves_the_stop_index_with_its_final_flag():
    ledger = RequestLedger(FINAL)
    done, unnamed = ledger.track(Sender(), "r1"), ledger.track(Sender())
    done.send(flags=FINAL)
    assert ledger.stop("r1") == 0 and not done.is_cancelled()  # ended first: the stop finds nothing
    assert ledger.stop("") == 0  # a request without an id is never found
    unnamed.send(flags=FINAL)
    assert ledger.running_ids() == 0 and ledger.stats().in_flight == 0


def test_stops_racing_finals_never_mark_an_ended_request_and_leave_no_entry():
    """Many threads stop ids while their requests send their finals: a request is marked stopped only
    while it runs (the index's lock is the final's), and every entry leaves with its final."""
    import sys
    import threading

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            ledger = RequestLedger(FINAL)
            senders = [ledger.track(Sender(), f"r{i % 50}") for i in range(400)]

            at_final = {}

            def finish(part):
                for sender in part:
                    sender.send(flags=FINAL)
                    at_final[id(sender)] = sender.is_stopped  # from here on it must never change

            def stop():
                for i in range(400):
                    ledger.stop(f"r{i % 50}")

            threads = [threading.Thread(target=finish, args=(senders[k::4],)) for k in range(4)]
            threads += [threading.Thread(target=stop) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wrong = [s.request_id for s in senders if s.is_stopped != at_final[id(s)]]  # marked after its final
            assert wrong == [] and ledger.running_ids() == 0 and ledger.stats().in_flight == 0
            assert ledger.stats().stopped == sum(s.is_stopped for s in senders)
    finally:
        sys.setswitchinterval(interval)


def test_a_final_that_could_not_be_sent_still_leaves_the_stop_index():
    ledger = RequestLedger(FINAL)
    sender = ledger.track(Sender(fail=True), "r1")
    with pytest.raises(RuntimeError):
        sender.send(flags=FINAL)
    assert ledger.running_ids() == 0 and ledger.stop("r1") == 0


def test_a_stop_that_came_first_is_remembered_only_when_asked_and_only_for_a_while():
    """Several instances: a STOP may run before its request reaches another instance's execute()."""
    now = [100.0]
    ledger = RequestLedger(FINAL, clock=lambda: now[0])
    assert ledger.stop("late", remember_s=10.0) == 0
    assert ledger.stop("plain") == 0  # one instance: not remembered
    late, plain = ledger.track(Sender(), "late"), ledger.track(Sender(), "plain")
    assert late.is_cancelled() and not plain.is_cancelled() and ledger.stats().stopped == 1
    assert not ledger.track(Sender(), "late").is_cancelled()  # remembered for one request
    ledger.stop("old", remember_s=10.0)
    now[0] += 11.0
    assert not ledger.track(Sender(), "old").is_cancelled()  # forgotten after its time
