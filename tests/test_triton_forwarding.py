"""The real tritonserver with `vocoder_forward_chunks` on (pipeline/chunk_forwarder.py; served off until
its H200 A/B, issue 34 round 16): the engine's thread hands a plain stream's chunks to the in-process
vocoder. Streamed audio equals the offline audio bit for bit, concurrent streams with cancels end
with every engine row and vocoder slot free, a clone and a continuation (not forwarded) still
serve, and the server shuts down without a stub crash."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from client.tts_client import TTSClient, build_inputs
from test_triton_pipeline import SPF, speak, tone_wav
from triton_server import copy_repository, start_server, stop_server

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forwarding")
    repo = copy_repository(tmp, moss_tts={"vocoder_forward_chunks": "true"})
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp / "server.log", repository=repo)
    assert server.model_config("moss_tts")["parameters"]["vocoder_forward_chunks"]["string_value"] == "true"
    yield server
    stop_server(server, timeout=45)


FORWARDED = 'moss_engine{stat="chunks_forwarded"}'


def test_forwarded_streaming_equals_non_streaming(server):
    before = server.settled_metrics()[FORWARDED]
    streamed = speak(server, stream=True, max_frames=23, ignore_stop=True, first_chunk_frames=2, chunk_frames=5)
    # its 6 chunks went through the engine's thread (the gauges refresh every 0.25 s)
    assert server.wait_for_metrics(lambda m: m[FORWARDED] >= before + 6, timeout=10)[FORWARDED] == before + 6
    whole = speak(server, stream=False, max_frames=23, ignore_stop=True)
    assert [c.shape[1] for c in streamed.chunks] == [2 * SPF, 4 * SPF, 5 * SPF, 5 * SPF, 5 * SPF, 2 * SPF]
    peak = np.abs(whole.audio).max()
    assert peak > 0 and np.abs(streamed.audio - whole.audio).max() <= 1e-6 * peak


def test_concurrent_streams_with_cancels_free_everything(server):
    before = server.settled_metrics()

    def one(i: int):
        client = TTSClient(server.grpc_url)
        inputs = build_inputs(f"Stream number {i} speaks.", seed=i, max_frames=40 if i % 2 else 400, ignore_stop=True,
                              first_chunk_frames=1, chunk_frames=2, stream=True)
        if i % 2:  # runs to its end
            return client.synthesize(inputs).audio.shape
        stream = client.stream(inputs)
        next(stream)
        stream.close()  # cancelled after its first audio, the engine still making its frames
        return None

    with ThreadPoolExecutor(8) as pool:
        shapes = list(pool.map(one, range(8)))
    assert [s for s in shapes if s is not None] == [(2, 40 * SPF)] * 4
    after = server.wait_for_metrics(lambda m: server.is_idle(m) and m['moss_engine{stat="requests_cancelled"}']
                                    >= before['moss_engine{stat="requests_cancelled"}'] + 4, timeout=30)
    assert server.is_idle(after), after


def test_clone_and_continuation_still_serve(server):
    ref = tone_wav(1.2, 200.0)
    before = server.settled_metrics()[FORWARDED]
    clone = speak(server, reference_audio=ref, max_frames=6, ignore_stop=True, stream=True, first_chunk_frames=2,
                  chunk_frames=2)
    assert clone.audio.shape == (2, 6 * SPF)
    forwarded = server.settled_metrics()[FORWARDED]
    assert forwarded == before + 3  # a clone's chunks are forwarded (2 + 2 + 2 frames)
    cont = speak(server, "and this follows.", reference_audio=ref, reference_text="This was said. ",
                 mode="continuation", max_frames=5, ignore_stop=True, stream=True)
    assert cont.audio.shape == (2, 5 * SPF)
    assert server.settled_metrics()[FORWARDED] == forwarded  # a continuation's chunks are its own thread's
