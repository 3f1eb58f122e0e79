"""Text sessions without Triton: the registry (fake clock) and a session's requests in order."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from moss_tts.contract.errors import ErrorKind, InvalidRequest, ServingError
from moss_tts.pipeline.segmented_codes import VOICE_FRAMES
from moss_tts.pipeline.speech_stream import SpeechStream
from moss_tts.pipeline.stream_ports import CodesChunk
from moss_tts.pipeline.synthesis_request import parse_session_inputs
from moss_tts.sessions.registry import SessionConfig, SessionRegistry
from moss_tts.sessions.session_request import SessionChildren, SessionClient, SessionCodes, SessionRequest
from shared_state import SharedList
from test_speech_pipeline import EMPTY, FakeChildren, FakeClient, codes


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def registry(**config):
    ended, clock = [], Clock()
    ids = iter(range(1, 1000))
    return SessionRegistry(SessionConfig(**config), ended.append, lambda: next(ids), clock), ended, clock


def assert_all_free(reg):
    stats = reg.stats()
    assert stats.open == 0 and stats.waiting == 0, stats


class FakeCodes:
    def __init__(self, chunks):
        self.chunk_list = chunks

    def chunks(self):
        yield from self.chunk_list

    def wake(self):
        pass

    def abort(self):
        pass


def speak(reg, session_id, frames, is_end=False, cancel_after=None, children_log=None):
    """One request of a session, run to the end on this thread: (client, vocoder calls)."""
    session, ticket, is_new = reg.join(session_id, is_end, frames is not None)
    fake = FakeClient(cancel_after)
    client = SessionClient(fake, (lambda: reg.close(session, "ended")) if is_end else (lambda: None))
    stream = None
    children = None
    if frames is not None:
        chunks = [CodesChunk(codes(n, 10 * i), EMPTY) for i, n in enumerate(frames)]
        inner = SessionCodes(FakeCodes(chunks), session, is_new)
        children = FakeChildren(list(inner.chunks()))
        # The fake's chunks come at once: the client is asked at each (served: every 0.25 s at most).
        stream = SpeechStream(SessionChildren(children, session, is_end, client), client, True, True, cancel_poll_s=0)
    SessionRequest(reg, session, ticket, stream, client).run()
    return fake, [] if children is None else children.vocoder_calls, session


def test_one_vocoder_sequence_across_requests_ended_by_session_end():
    reg, ended, _ = registry()
    first, calls1, session = speak(reg, "s1", [2, 4])
    second, calls2, _ = speak(reg, "s1", [3])
    third, calls3, _ = speak(reg, "s1", None, is_end=True)
    assert calls1 == [(2, True, False), (4, False, False)]  # no END after a segment
    assert calls2 == [(3, False, False)]  # no START: the sequence continues
    assert ended == [session.sequence_id]  # the SESSION_END alone ended it (through the registry)
    assert [c.finals for c in (first, second, third)] == [1, 1, 1] and not third.errors
    assert_all_free(reg)
    assert reg.stats().ended == 1


def test_session_end_with_text_ends_the_sequence_before_its_final():
    reg, ended, _ = registry()
    speak(reg, "s", [2])
    _, calls, _ = speak(reg, "s", [1], is_end=True)
    assert calls == [(1, False, False), (0, False, True)] and ended == []
    assert_all_free(reg)


def test_the_first_segment_gives_its_voice_to_the_later_ones():
    reg, _, _ = registry()
    _, _, session = speak(reg, "v", [VOICE_FRAMES - 5, 20])
    voice = session.voice_codes()
    assert voice.shape == (VOICE_FRAMES, 12)
    speak(reg, "v", [3])
    assert np.array_equal(session.voice_codes(), voice)  # later segments do not change it
    speak(reg, "v", None, is_end=True)
    assert session.voice_codes() is None  # freed


def test_a_cancel_frees_the_whole_session_and_later_requests_are_told():
    reg, ended, _ = registry()
    speak(reg, "c", [2, 2])
    client, calls, session = speak(reg, "c", [2, 2, 2], cancel_after=1)
    assert client.errors[0][0] is ErrorKind.CANCELLED
    assert calls[-1] == (0, False, True)  # the failed request ended the sequence itself
    assert ended == [] and reg.stats().cancelled == 1
    assert_all_free(reg)
    with pytest.raises(InvalidRequest, match="'c' is closed: a request of it was cancelled"):
        reg.join("c", False, True)


def test_requests_run_in_order_and_waiters_are_released_by_a_close():
    reg, _, _ = registry()
    session, first, _ = reg.join("o", False, True)
    _, second, _ = reg.join("o", False, True)
    results = []
    waiter = threading.Thread(target=lambda: results.append(session.wait_turn(second, lambda: False, wait_s=0.01)))
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive()  # the first request still runs
    reg.finish(session, "failed")
    waiter.join(2)
    assert results == [False] and reg.stats().failed == 1


def test_idle_sessions_expire_and_a_late_request_is_told_why():
    reg, ended, clock = registry(session_idle_timeout_s=5)
    speak(reg, "idle", [2])
    busy, ticket, _ = reg.join("busy", False, True)  # a request still running is never idle
    clock.now += 4
    assert reg.expire() == 0
    clock.now += 2
    assert reg.expire() == 1 and len(ended) == 1
    with pytest.raises(InvalidRequest, match=r"'idle' is closed: it was idle for more than 5 s"):
        reg.join("idle", False, True)
    reg.finish(busy)
    reg.close(busy, "ended")
    assert_all_free(reg)
    assert reg.stats().expired == 1


def test_limits_and_bad_input():
    reg, _, _ = registry(max_sessions=1)
    reg.join("a", False, True)
    with pytest.raises(ServingError) as exc:
        reg.join("b", False, True)
    assert exc.value.kind is ErrorKind.UNAVAILABLE and "max_sessions" in str(exc.value)
    with pytest.raises(InvalidRequest, match="SESSION_END for unknown session 'x'"):
        reg.join("x", True, False)
    with pytest.raises(ValueError, match="session_idle_timeout_s"):
        SessionConfig(session_idle_timeout_s=0)
    parsed = SessionConfig.from_parameters({"max_sessions": "3", "session_idle_timeout_s": "2.5"})
    assert parsed == SessionConfig(3, 2.5)


def inputs(**values):
    arrays = {k: np.array([v], dtype=object if isinstance(v, str) else None) for k, v in values.items()}
    return lambda name: arrays.get(name)


def test_session_inputs_are_validated():
    assert parse_session_inputs(inputs(TEXT="hi")) is None
    s = parse_session_inputs(inputs(TEXT=" ", SESSION_ID="abc", SESSION_END=True))
    assert (s.session_id, s.is_end, s.has_text) == ("abc", True, False)
    for bad, message in ((dict(TEXT="hi", SESSION_END=True), "SESSION_END needs SESSION_ID"),
                         (dict(TEXT="hi", SESSION_ID="x" * 129), "1 to 128 printable"),
                         (dict(TEXT="hi", SESSION_ID="a\nb"), "printable"),
                         (dict(TEXT="", SESSION_ID="a"), "only with SESSION_END")):
        with pytest.raises(InvalidRequest, match=message):
            parse_session_inputs(inputs(**bad))


def test_a_session_held_by_another_instance_is_refused_not_opened_again(tmp_path):
    """Two instances of moss_tts (two processes, one claims directory): a request that reached the
    instance not holding its session is refused with a message naming both, instead of opening a
    second session there (another voice); once the holder closes it, the claim is gone."""
    from moss_tts.sessions.claims import SessionClaims, SessionHeldElsewhere

    ids = iter(range(1, 1000))
    a = SessionRegistry(SessionConfig(), lambda _: None, lambda: next(ids),
                        claims=SessionClaims(tmp_path / "claims", "moss_tts_0_0"))
    b = SessionRegistry(SessionConfig(), lambda _: None, lambda: next(ids),
                        claims=SessionClaims(tmp_path / "claims", "moss_tts_0_1"))
    session, _, is_new = a.join("s1", is_end=False, has_text=True)
    assert is_new
    with pytest.raises(SessionHeldElsewhere, match="held by moss_tts_0_0.*reached moss_tts_0_1") as refused:
        b.join("s1", is_end=False, has_text=True)
    assert refused.value.kind is ErrorKind.UNAVAILABLE and b.stats().opened == 0 and not b.is_open("s1")
    b.join("s2", is_end=False, has_text=True)  # another session opens on b
    a.finish(session, "ended")
    assert len(list((tmp_path / "claims").iterdir())) == 1  # s1's claim went, b's s2 stays
    b.join("s1", is_end=False, has_text=True)  # released: b may hold it now
    assert b.is_open("s1")
    a.stop()
    assert (tmp_path / "claims").is_dir()  # b still holds claims
    b.stop()
    assert not (tmp_path / "claims").exists()  # the last instance out removes the directory


def test_an_instance_takes_over_its_own_stale_claim(tmp_path):
    """A claim left by an earlier stub of the same instance (Triton restarted it) is not a refusal."""
    from moss_tts.sessions.claims import SessionClaims

    claims = SessionClaims(tmp_path, "moss_tts_0_0")
    claims.claim("s1")
    restarted = SessionClaims(tmp_path, "moss_tts_0_0")
    restarted.claim("s1")
    restarted.release("s1")
    assert not any(tmp_path.iterdir())


def test_indexed_requests_run_in_index_order_whatever_order_they_arrive_in():
    # A server with several instances relays a session's requests to its holder, where they can
    # arrive out of order: SESSION_INDEX, not arrival, decides the turn.
    reg, _, _ = registry()
    order, threads = SharedList(), []  # order: appended by the four request threads
    for index in (2, 0, 3, 1):  # arrival order
        session, ticket, _ = reg.join("s", is_end=index == 3, has_text=True, index=index)
        assert ticket == index

        def run(session=session, ticket=ticket):
            assert session.wait_turn(ticket, lambda: False, wait_s=0.05)
            order.append(ticket)
            reg.finish(session)
        threads.append(threading.Thread(target=run))
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert order.snapshot() == [0, 1, 2, 3]
    assert reg.stats().waiting == 0


def test_an_index_out_of_place_is_refused_and_leaves_nothing():
    reg, _, _ = registry()
    session, _, _ = reg.join("s", False, True, index=0)
    with pytest.raises(InvalidRequest, match="SESSION_INDEX 0 was already sent"):
        reg.join("s", False, True, index=0)
    with pytest.raises(InvalidRequest, match="SESSION_INDEX on every request"):
        reg.join("s", False, True)  # the session is indexed
    reg.finish(session)
    with pytest.raises(InvalidRequest, match="SESSION_INDEX 0 was already sent"):
        reg.join("s", False, True, index=0)  # its turn has passed
    unindexed, _, _ = reg.join("u", False, True)
    with pytest.raises(InvalidRequest, match="SESSION_INDEX on no request"):
        reg.join("u", False, True, index=1)
    reg.finish(unindexed)
    assert reg.stats().opened == 2 and reg.stats().waiting == 0


def test_a_missing_first_index_fails_the_session_and_a_later_gap_is_skipped():
    # A request refused before it reached the holder (on another instance) never takes its index:
    # GAP_S later its turn is skipped, or, for index 0 (the voice), the session fails.
    from moss_tts.sessions.registry import GAP_S

    reg, _, clock = registry()
    session, ticket, _ = reg.join("s", False, True, index=1)  # index 0 never comes
    reg.expire()  # the gap is seen
    clock.now += GAP_S / 2
    reg.expire()
    assert session.closed is None
    clock.now += GAP_S
    reg.expire()
    assert session.closed == "failed"
    assert not session.wait_turn(ticket, lambda: False)  # the waiter learns it at once
    reg.finish(session)
    assert_all_free(reg)

    other, first, _ = reg.join("t", False, True, index=0)
    reg.finish(other)  # index 0 spoken
    _, third, _ = reg.join("t", False, True, index=2)  # index 1 was refused elsewhere
    reg.expire()
    clock.now += GAP_S + 0.1
    reg.expire()
    assert other.closed is None and other.wait_turn(third, lambda: False, wait_s=0.05)  # skipped to 2
    with pytest.raises(InvalidRequest, match="its turn was skipped"):
        reg.join("t", False, True, index=1)  # too late
    reg.finish(other)
    assert reg.stats().waiting == 0


def test_an_indexed_session_end_may_arrive_first():
    reg, _, _ = registry()
    session, ticket, is_new = reg.join("s", is_end=True, has_text=False, index=3)
    assert is_new and ticket == 3
    with pytest.raises(InvalidRequest, match="SESSION_END for unknown session"):
        reg.join("u", is_end=True, has_text=False)  # unindexed: nothing to wait for


def test_the_claims_directory_must_be_private_and_owner_names_well_formed(tmp_path):
    import os

    from moss_tts.sessions.claims import SessionClaims

    ours = tmp_path / "left-by-an-earlier-server"
    ours.mkdir()
    os.chmod(ours, 0o777)
    SessionClaims(ours, "moss_tts_0_0")  # ours: made private
    assert ours.stat().st_mode & 0o777 == 0o700
    link = tmp_path / "a-link"
    link.symlink_to(ours)
    with pytest.raises(PermissionError, match="mode 0700"):
        SessionClaims(link, "moss_tts_0_0")  # not a directory of its own
    with pytest.raises(ValueError, match="instance name"):
        SessionClaims(tmp_path / "claims", "../evil")
    claims = SessionClaims(tmp_path / "claims", "moss_tts_0_0")
    claims.claim("s")
    path = next((tmp_path / "claims").iterdir())
    path.write_text("../../tmp/x")  # a forged claim
    assert SessionClaims._owner(path) == ""  # not a name: never becomes a socket path


def test_session_index_is_parsed_and_checked():
    def get_of(values):
        return lambda name: None if values.get(name) is None else np.array([values[name]])

    assert parse_session_inputs(get_of({"SESSION_ID": "s", "TEXT": "Hi.", "SESSION_INDEX": 4})).index == 4
    assert parse_session_inputs(get_of({"SESSION_ID": "s", "TEXT": "Hi."})).index is None
    with pytest.raises(InvalidRequest, match="SESSION_INDEX must be 0, 1, 2"):
        parse_session_inputs(get_of({"SESSION_ID": "s", "TEXT": "Hi.", "SESSION_INDEX": -1}))
    with pytest.raises(InvalidRequest, match="SESSION_INDEX needs SESSION_ID"):
        parse_session_inputs(get_of({"TEXT": "Hi.", "SESSION_INDEX": 0}))
