"""Text sessions on a server with two moss_tts instances (the replicas layouts' shape, here two
CPU instances): Triton hands each request to either instance, so a session's later request can
reach the one that does not hold it. It must be refused with a clear error, never open a second
session there (another voice, audio that does not continue the first)."""

from __future__ import annotations

import pytest

from client.tts_client import InferenceServerException, TTSClient, build_inputs, error_code
from perf.soak_metrics import idle_problems
from triton_server import copy_repository, start_server, stop_server

pytestmark = pytest.mark.triton

SESSIONS = 'moss_tts_sessions{{stat="{}"}}'


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


def test_a_session_request_on_the_other_instance_is_refused_and_opens_nothing(server):
    before = server.settled_metrics()
    results = [speak(server, f"Segment number {i}.", "two-instances", seed=1, max_frames=2, ignore_stop=True)
               for i in range(12)]
    served = [samples for samples, error in results if error is None]
    refused = [error for _, error in results if error is not None]
    said = [(samples, error.message() if error else None) for samples, error in results]
    assert served and results[0][1] is None, said  # the first request opened the session
    for error in refused:
        assert error_code(error) == "UNAVAILABLE", error.message()
        assert "is held by moss_tts_0_" in error.message() and "one moss_tts instance" in error.message()
    after = server.settled_metrics()
    opened = after[SESSIONS.format("opened")] - before.get(SESSIONS.format("opened"), 0)
    assert opened == 1, f"{opened} sessions opened for one session id: a request opened a second one"
    assert all(samples == 2 * 3840 for samples in served)
    # Requests alternate between the instances in practice: the refusal path was reached.
    assert refused, "every request reached the holding instance: the test proved nothing"
    for _ in range(20):  # SESSION_END must reach the holder
        _, error = speak(server, "", "two-instances", session_end=True)
        if error is None:
            break
    assert error is None, error.message()
    rows = 2 * server.parameter("moss_tts", "max_running_requests")  # both instances' engines
    freed = server.wait_for_metrics(lambda m: m[SESSIONS.format("open")] == 0 and not idle_problems(m, rows))
    assert freed[SESSIONS.format("open")] == 0 and not idle_problems(freed, rows), idle_problems(freed, rows)
