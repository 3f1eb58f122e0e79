"""Text sessions with the codec over BLS (moss_tts parameter vocoder=bls, the split layout's
path; tiny checkpoint, CPU): the session's one vocoder sequence lives in the `vocoder` model,
and closing the session, by SESSION_END or by a cancel, ends it there at once (an END call,
serving/stream_io.end_sequence), not 20 s later by the vocoder's idle janitor."""

from __future__ import annotations

import numpy as np
import pytest

from client.tts_client import TTSClient
from test_text_session_triton import all_free, cancel_after_first_chunk
from test_shutdown import EXIT_IN_FLIGHT_S, assert_clean_exit, stop_with_streams_in_flight
from triton_server import copy_repository, start_server, stop_server, stub_pids

pytestmark = pytest.mark.triton

SPF = 3840  # samples per frame per channel
FRAMES = 4
OPTIONS = dict(seed=3, max_frames=FRAMES, ignore_stop=True, first_chunk_frames=2, chunk_frames=2)
ACTIVE = 'moss_vocoder_sessions{state="active"}'
STARTED, ENDED, EXPIRED = (f'moss_vocoder{{stat="sessions_{s}"}}' for s in ("started", "ended", "expired"))
CANCELLED = 'moss_vocoder{stat="sessions_cancelled"}'
SESSIONS_OPEN = 'moss_tts_sessions{stat="open"}'
# Well below the vocoder's idle janitor (max_sequence_idle_microseconds, 20 s): an END call, not it.
END_WITHIN_S = 8.0


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("session_bls")
    repo = copy_repository(tmp, moss_tts={"vocoder": "bls"})
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp / "server.log", repository=repo)
    yield server
    stop_server(server, timeout=45)


def closed_sequences(m: dict) -> float:
    return m[ENDED] + m[CANCELLED]


def test_session_end_ends_its_one_sequence_in_the_vocoder_model(server):
    before = server.settled_metrics()
    session = TTSClient(server.grpc_url).text_session(**OPTIONS)
    session.send_text("The first sentence is short. The second one is too.")
    session.end()
    chunks = list(session.chunks())
    assert len(session.segments) == 2
    audio = np.concatenate([c.audio for c in chunks], axis=1)
    assert audio.shape == (2, 2 * FRAMES * SPF)
    after = server.wait_for_metrics(lambda m: m[ACTIVE] == 0 and closed_sequences(m) > closed_sequences(before),
                                    timeout=END_WITHIN_S)
    assert after[STARTED] - before[STARTED] == 1  # one sequence for both segments
    assert closed_sequences(after) - closed_sequences(before) == 1 and after[EXPIRED] == before[EXPIRED]
    all_free(server)


def test_a_cancelled_session_ends_its_sequence_in_the_vocoder_model(server):
    before = server.settled_metrics()
    cancel_after_first_chunk(server.grpc_url)
    after = server.wait_for_metrics(lambda m: m[ACTIVE] == 0 and closed_sequences(m) > closed_sequences(before)
                                    and m[SESSIONS_OPEN] == 0, timeout=END_WITHIN_S)
    assert after[ACTIVE] == 0 and closed_sequences(after) > closed_sequences(before)
    assert after[EXPIRED] == before[EXPIRED]
    all_free(server)


def test_streams_and_sessions_in_flight_at_sigterm_end_cleanly_over_bls(server):
    """Last in this module: it stops the module's server. With the codec over BLS a stream (or a
    session) that ends at shutdown makes no END call after its final response: one could land as
    Triton finalizes moss_tts, which crashes tritonserver 2.51 (serving/stop_watch.py); the
    vocoder's sequences end with the server."""
    stubs = stub_pids(server)
    took = stop_with_streams_in_flight(server)
    assert_clean_exit(server, took, stubs, EXIT_IN_FLIGHT_S)
