"""What a client and an operator see when capacity runs out and when a model's stub dies (the
real server, a copy of the repository with moss_tts max_streams=2, and max_sessions=1 with a 2 s
session idle timeout for the text-session test)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import numpy as np
import pytest

from client.server_health import check
from client.tts_client import InferenceServerException, TTSClient, build_inputs, error_code
from triton_server import copy_repository, start_server, stop_server, stub_pids

pytestmark = pytest.mark.triton


def long_stream(server):
    return TTSClient(server.grpc_url).stream(build_inputs("Hold the line.", seed=1, max_frames=1900, ignore_stop=True,
                                                          first_chunk_frames=1, chunk_frames=2))


def fails_fast(server, seconds: float = 15.0, **options) -> InferenceServerException:
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        TTSClient(server.grpc_url).synthesize(build_inputs("Hello.", seed=1, max_frames=3, ignore_stop=True, **options))
    assert time.monotonic() - start < seconds, "the error took too long: something waited instead of failing"
    return info.value


def vocode_directly(url: str):
    """One START|END call of a direct codec client to the vocoder model."""
    import tritonclient.grpc as grpcclient

    codes = grpcclient.InferInput("CODES", [1, 2, 12], "INT32")
    codes.set_data_from_numpy(np.zeros((1, 2, 12), np.int32))
    return grpcclient.InferenceServerClient(url).infer("vocoder", [codes], sequence_id=7, sequence_start=True,
                                                      sequence_end=True, client_timeout=30)


def wait_for(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.2)
    return value


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("failures")
    repo = copy_repository(tmp, moss_tts={"max_streams": "2", "max_sessions": "1", "session_idle_timeout_s": "2"})
    # A short exit timeout: the last test kills moss_tts's stub, and Triton then waits out its exit
    # timeout for a model it cannot unload (30 s by default, spent for nothing).
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp / "server.log", repository=repo,
                          args=("--exit-timeout-secs=8",))
    yield server
    stop_server(server, timeout=45)


def test_a_stream_beyond_capacity_is_unavailable_at_once(server):
    held = [long_stream(server) for _ in range(2)]
    for stream in held:
        next(stream)  # both running
    error = fails_fast(server, seconds=5)
    assert error_code(error) == "UNAVAILABLE" and "busy" in error.message()
    # The gauges publish every 0.25 s: see the two streams there first, or "idle" below could be
    # a reading from before they started (a CI run saw the next request refused as busy).
    wait_for(lambda: server.metrics()['moss_engine{stat="streams"}'] == 2)
    for stream in held:
        stream.close()  # cancels them
    wait_for(lambda: server.is_idle(server.metrics()))
    assert TTSClient(server.grpc_url).synthesize(build_inputs("Again.", max_frames=2, ignore_stop=True)).audio.size


def session_request(server, text, session_id, **options):
    """One text-session request on a stream of its own: its audio chunks, or the error."""
    return list(TTSClient(server.grpc_url).stream(build_inputs(text, session_id=session_id, **options)))


def test_an_idle_text_session_is_freed_and_a_late_request_told_why(server):
    sessions = lambda m, stat: m[f'moss_tts_sessions{{stat="{stat}"}}']  # noqa: E731
    before = server.settled_metrics()
    audio = session_request(server, "Hello there.", "idle-1", seed=1, max_frames=3, ignore_stop=True)
    assert sum(a.shape[1] for a in audio) == 3 * 3840
    with pytest.raises(InferenceServerException) as busy:  # max_sessions=1
        session_request(server, "Another.", "idle-2", max_frames=2)
    assert error_code(busy.value) == "UNAVAILABLE" and "max_sessions" in busy.value.message()
    after = server.wait_for_metrics(lambda m: sessions(m, "expired") > sessions(before, "expired")
                                    and sessions(m, "open") == 0 and server.is_idle(m), timeout=10)
    assert sessions(after, "open") == 0 and server.is_idle(after), after  # voice and vocoder sequence freed
    with pytest.raises(InferenceServerException) as late:
        session_request(server, "Too late.", "idle-1", max_frames=2)
    assert error_code(late.value) == "INVALID_ARGUMENT"
    assert "'idle-1' is closed: it was idle for more than 2 s" in late.value.message()


def test_a_refused_vocoder_request_leaves_no_session(server):
    """Direct codec calls that the vocoder refuses (codes out of range, a wrong shape, a sequence
    that never started) get INVALID_ARGUMENT and hold no slot: the slot count is back at once,
    not after the 20 s idle timeout."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)

    def call(codes: np.ndarray, seq: int, start: bool, end: bool):
        tensor = grpcclient.InferInput("CODES", list(codes.shape), "INT32")
        tensor.set_data_from_numpy(codes)
        with pytest.raises(InferenceServerException) as err:
            client.infer("vocoder", [tensor], sequence_id=seq, sequence_start=start, sequence_end=end,
                         client_timeout=30)
        return err.value

    cases = [(np.full((1, 2, 12), 99999, np.int32), 71, True, False),  # START, codes out of range
             (np.zeros((1, 2, 11), np.int32), 72, True, False),  # START, 11 codebooks
             (np.full((1, 2, 12), -1, np.int32), 73, True, True),  # START|END, negative codes
             (np.zeros((1, 2, 12), np.int32), 74, False, False)]  # never started
    for codes, seq, start, end in cases:
        error = call(codes, seq, start, end)
        assert error_code(error) == "INVALID_ARGUMENT", (seq, error.message())
    # The gauge refreshes every 0.25 s; a session a refused call left would stay for 20 s.
    held = lambda m: m.get('moss_vocoder_sessions{state="active"}')  # noqa: E731
    assert held(server.wait_for_metrics(lambda m: held(m) == 0, timeout=3)) == 0, "a refused call left a session"


def test_a_dead_vocoder_stub_leaves_speech_working_and_turns_health_false(server, tmp_path):
    """moss_tts decodes in its own process (vocoder=in_process): the vocoder model serves only
    direct codec clients, so its death fails those at once and turns health false (Triton never
    restarts a stub: the operator must), while speech keeps being served."""
    from shim_server import start_shim, stop_shim

    assert check(server.metrics_url) is None
    os.kill(stub_pids(server)["vocoder_0_0"], signal.SIGKILL)
    speech = TTSClient(server.grpc_url).synthesize(build_inputs("Still spoken.", seed=1, max_frames=3, ignore_stop=True))
    assert speech.audio.shape == (2, 3 * 3840)
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as direct:
        vocode_directly(server.grpc_url)
    assert time.monotonic() - start < 15.0, "the error took too long: something waited instead of failing"
    assert "vocoder_0_0" in direct.value.message() and "not healthy" in direct.value.message()
    codes = TTSClient(server.grpc_url).synthesize(  # codes alone never need a vocoder
        build_inputs("Codes still work.", max_frames=2, ignore_stop=True), output="CODES")
    assert sum(chunk.shape[0] for chunk in codes.chunks) == 2
    problem = wait_for(lambda: check(server.metrics_url), timeout=10)
    assert "vocoder_0_0" in problem and "moss_tts_0_0" not in problem
    shim = start_shim(server.grpc_url, tmp_path / "shim.log", tmp_path, "--metrics-url", server.metrics_url,
                      health=503)
    try:
        assert "vocoder_0_0" in httpx.get(f"{shim.url}/health").json()["error"]["message"]
        assert httpx.post(f"{shim.url}/v1/audio/speech", json={"input": "Hi."}, timeout=30).status_code == 503
    finally:
        stop_shim(shim)


def test_a_dead_entry_stub_fails_requests_fast(server):
    os.kill(stub_pids(server)["moss_tts_0_0"], signal.SIGKILL)
    error = fails_fast(server)
    assert "moss_tts_0_0" in error.message() and "not healthy" in error.message()
    assert "moss_tts_0_0" in wait_for(lambda: check(server.metrics_url), timeout=10)
