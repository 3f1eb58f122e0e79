"""Text sessions on a server with two moss_tts instances (the replicas layouts' shape, here two
CPU instances). Triton hands each request to either instance, and nothing routes a session's
requests to the one holding it: one that reaches the other instance is relayed to the holder
(sessions/relay.py) and its audio comes back through the instance it reached. The session
stays one: one voice, one vocoder sequence, its requests spoken in SESSION_INDEX order. An in-band
STOP that reaches the instance not running its request is asked of the other (stop_requests.py)."""

from __future__ import annotations

import time

import pytest

from client.tts_client import STOP_WAIT_S, InferenceServerException, TTSClient, build_inputs
from perf.soak_metrics import idle_problems
from triton_server import copy_repository, start_server, stop_server

pytestmark = pytest.mark.triton

SPF = 3840  # samples per frame per channel
SESSIONS = 'moss_tts_sessions{{stat="{}"}}'
VOCODER_STARTED = 'moss_tts_vocoder{stat="sessions_started"}'  # summed over both instances


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("instances")
    repo = copy_repository(tmp)
    config = repo / "moss_tts" / "config.pbtxt"
    text = config.read_text()
    assert text.count("instance_group [ { count: 1, kind: KIND_MODEL } ]") == 1
    config.write_text(text.replace("instance_group [ { count: 1, kind: KIND_MODEL } ]",
                                   "instance_group [ { count: 2, kind: KIND_MODEL } ]"))
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp / "server.log", repository=repo)
    yield server
    stop_server(server, timeout=45)


def speak(server, text, session_id, **options):
    """One text-session request on a stream of its own: (audio samples, None) or (0, the error)."""
    try:
        chunks = list(TTSClient(server.grpc_url).stream(build_inputs(text, session_id=session_id, **options)))
        return sum(c.shape[1] for c in chunks), None
    except InferenceServerException as exc:
        return 0, exc


def delta(after, before, stat):
    name = SESSIONS.format(stat) if stat != "vocoder" else VOCODER_STARTED
    return after.get(name, 0) - before.get(name, 0)


def all_free(server):
    rows = 2 * server.parameter("moss_tts", "max_running_requests")  # both instances' engines
    freed = server.wait_for_metrics(lambda m: m[SESSIONS.format("open")] == 0 and not idle_problems(m, rows),
                                    fresh=True)
    assert freed[SESSIONS.format("open")] == 0 and not idle_problems(freed, rows), idle_problems(freed, rows)


def test_a_session_whose_requests_reach_both_instances_is_spoken_as_one(server):
    before = server.settled_metrics()
    results = [speak(server, f"Segment number {i}.", "two-instances", session_index=i, seed=1, max_frames=2,
                     ignore_stop=True) for i in range(12)]
    said = [error.message() for _, error in results if error is not None]
    assert not said, said
    assert [samples for samples, _ in results] == [2 * SPF] * 12
    samples, error = speak(server, "", "two-instances", session_end=True, session_index=12)
    assert error is None, error.message()
    after = server.settled_metrics()
    assert delta(after, before, "opened") == 1, "a request opened a second session for one session id"
    assert delta(after, before, "ended") == 1
    # Requests alternate between the instances in practice: the relay was used.
    assert delta(after, before, "relayed") >= 1, "every request reached the holder: the test proved nothing"
    assert delta(after, before, "vocoder") == 1, "the session's audio did not continue one vocoder sequence"
    all_free(server)


def test_segments_sent_at_once_on_one_stream_come_back_in_text_order(server):
    # The client sends every segment at once on one gRPC stream, each with its SESSION_INDEX; those
    # that reach the other instance arrive late at the holder, which still speaks them in order.
    before = server.settled_metrics()
    frames = 4
    session = TTSClient(server.grpc_url).text_session(seed=2, max_frames=frames, ignore_stop=True,
                                                      first_chunk_frames=2, chunk_frames=2)
    session.send_text("One. Two. Three. Four. Five. Six. Seven. Eight.")
    session.end()
    chunks = list(session.chunks())
    assert len(session.segments) == 8, session.segments
    assert [c.segment for c in chunks] == sorted(c.segment for c in chunks), [c.segment for c in chunks]
    assert sum(c.audio.shape[1] for c in chunks) == 8 * frames * SPF
    after = server.settled_metrics()
    assert delta(after, before, "opened") == 1 and delta(after, before, "vocoder") == 1
    assert delta(after, before, "relayed") >= 1, "every request reached the holder: the test proved nothing"
    all_free(server)


def test_a_cancel_of_a_relayed_request_closes_the_session_on_its_holder(server):
    relayed = False
    for attempt in range(8):  # until the cancelled request was one that reached the other instance
        session_id = f"cancel-relayed-{attempt}"
        before = server.settled_metrics()
        assert speak(server, "The first one.", session_id, session_index=0, seed=3, max_frames=2,
                     ignore_stop=True)[1] is None
        stream = TTSClient(server.grpc_url).stream(build_inputs(
            "A much longer one.", session_id=session_id, session_index=1, seed=3, max_frames=1900,
            ignore_stop=True, first_chunk_frames=1, chunk_frames=1))
        next(stream)  # it speaks
        m = server.wait_for_metrics(lambda m: delta(m, before, "relayed") >= 1, timeout=1.5)
        relayed = delta(m, before, "relayed") >= 1
        stream.close()  # the client cancels
        m = server.wait_for_metrics(lambda m: delta(m, before, "cancelled") == 1 and m[SESSIONS.format("open")] == 0)
        assert delta(m, before, "cancelled") == 1 and m[SESSIONS.format("open")] == 0, (
            f"relayed={relayed}: " + str({k: v for k, v in m.items() if "sessions" in k or "requests" in k}))
        all_free(server)
        if relayed:
            break
    assert relayed, "no cancelled request reached the other instance in 8 tries"


def test_an_utterance_left_early_is_stopped_whichever_instance_gets_its_stop(server):
    """Each early close sends a STOP on the stream; Triton gives it to either instance. Every STOP is
    answered (the close returns well within the client's wait, so no gRPC cancel followed) and stops
    its request: the ledgers' `stopped`, summed over both instances, goes up by one each time."""
    stopped = 'moss_tts_requests{stat="stopped"}'
    for attempt in range(6):
        before = server.settled_metrics()
        stream = TTSClient(server.grpc_url).stream(build_inputs(
            "A much longer one.", seed=attempt, max_frames=1900, ignore_stop=True, first_chunk_frames=1,
            chunk_frames=1))
        next(stream)
        started = time.monotonic()
        stream.close()
        took = time.monotonic() - started
        assert took < STOP_WAIT_S - 1.0, f"attempt {attempt}: the close took {took:.1f} s (the cancel fallback?)"
        m = server.wait_for_metrics(lambda m: m[stopped] - before[stopped] >= 1)
        assert m[stopped] - before[stopped] == 1, attempt
        all_free(server)
