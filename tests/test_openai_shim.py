"""The OpenAI-compatible shim end to end: the official `openai` SDK -> shim -> real tritonserver.

The tiny checkpoint speaks noise, so lengths are made exact with max_new_tokens + ignore_stop
(frames x 3840 samples per channel at 48 kHz).
"""

from __future__ import annotations

import base64
import io
import json
import socket
import threading

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from client.openai_shim.audio_encode import to_pcm16
from client.openai_shim.triton_stream import build_inputs as shim_inputs
from client.tts_client import InferenceServerException, TTSClient, build_inputs, error_code
from http_endpoint import HttpEndpoint
from shim_server import start_shim, stop_shim
from test_error_text import assert_no_object_repr
from triton_server import _free_port

pytestmark = pytest.mark.triton

SPF = 3840  # samples per frame per channel
FRAME_BYTES = SPF * 2 * 2  # s16le stereo
MODEL = "moss-tts"
TEXT = "Hello world."


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


NATIVE = {"sample_rate": 48000, "channels": 2}  # the server's own stream (the default is OpenAI's 24 kHz mono)


def fixed(frames: int, native: bool = True, **extra) -> dict:
    """extra_body for an exact length: seeded, max_new_tokens frames, never stopping early; by default
    in the native 48 kHz stereo, whose bytes equal the gRPC client's."""
    return {"seed": 7, "max_new_tokens": frames, "ignore_stop": True, **(NATIVE if native else {}), **extra}


def tone_wav(seconds: float, freq: float, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(buffer, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def data_uri(wav: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav).decode()


def grpc_pcm(triton, frames: int) -> bytes:
    """The same utterance straight from tritonserver, as s16le."""
    audio = TTSClient(triton.grpc_url).synthesize(build_inputs(TEXT, seed=7, max_frames=frames, ignore_stop=True))
    return to_pcm16(audio.audio.T)


def assert_same_pcm(a: bytes, b: bytes) -> None:
    """Equal up to one step of 16 bits: the vocoder's float rounding depends on the chunk schedule."""
    assert len(a) == len(b)
    assert np.abs(np.frombuffer(a, "<i2").astype(np.int32) - np.frombuffer(b, "<i2")).max() <= 1


def iter_sse(response):
    """Events one by one, as they arrive."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[len("data: "):])


@pytest.fixture(scope="module")
def pcm_40(triton) -> bytes:
    return grpc_pcm(triton, 40)


# --- the official SDK ------------------------------------------------------------------------------

def test_sdk_create_wav_is_openai_audio_or_native_of_exact_length(openai_shim):
    for extra, rate, shape in ((fixed(8, native=False), 24000, (8 * SPF // 2,)), (fixed(8), 48000, (8 * SPF, 2))):
        response = sdk(openai_shim.url).audio.speech.create(model=MODEL, voice="alloy", input=TEXT,
                                                            response_format="wav", extra_body=extra)
        audio, read_rate = sf.read(io.BytesIO(response.content), dtype="float32")  # a streamed wav reads to its end
        assert read_rate == rate and audio.shape == shape
        assert np.abs(audio).max() > 0


def test_pcm_equals_the_grpc_client_and_documents_itself(openai_shim, triton):
    raw = sdk(openai_shim.url).audio.speech.with_raw_response.create(
        model=MODEL, voice="default", input=TEXT, response_format="pcm", extra_body=fixed(8))
    assert raw.headers["content-type"] == "audio/pcm"
    assert (raw.headers["x-sample-rate"], raw.headers["x-channels"], raw.headers["x-sample-format"]) == \
        ("48000", "2", "s16le")
    assert_same_pcm(raw.content, grpc_pcm(triton, 8))


@pytest.mark.parametrize("name", ["flac", "mp3", "opus", "aac"])
def test_compressed_formats_decode_at_48k_stereo_when_asked(openai_shim, name):
    from test_openai_shim_audio import decoded

    response = sdk(openai_shim.url).audio.speech.create(model=MODEL, voice="default", input=TEXT,
                                                        response_format=name, extra_body=fixed(8))
    samples, rate, channels = decoded(response.content, name)
    assert (rate, channels) == (48000, 2)
    assert samples == 8 * SPF if name == "flac" else 8 * SPF <= samples < 9 * SPF  # codec padding: under a frame


def test_streamed_raw_wav_arrives_in_several_reads_and_equals_the_whole(openai_shim, pcm_40):
    with sdk(openai_shim.url).audio.speech.with_streaming_response.create(
            model=MODEL, voice="default", input=TEXT, response_format="wav",
            extra_body=fixed(40, stream=True, initial_codec_chunk_frames=1)) as response:
        assert response.headers["content-type"] == "audio/wav"
        reads = list(response.iter_bytes())
    data = b"".join(reads)
    assert len(reads) > 1
    assert data[:4] == b"RIFF"
    assert_same_pcm(data[44:], pcm_40)
    audio, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == 48000 and audio.shape == (40 * SPF, 2)


def test_sse_deltas_come_chunk_by_chunk_then_done(openai_shim, pcm_40):
    with sdk(openai_shim.url).audio.speech.with_streaming_response.create(
            model=MODEL, voice="default", input=TEXT, response_format="pcm", stream_format="sse",
            extra_body=fixed(40, initial_codec_chunk_frames=1)) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = list(iter_sse(response))
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 6 + ["speech.audio.done"]
    deltas = [base64.b64decode(e["audio"]) for e in events[:-1]]
    # the server's chunk schedule (first chunk 1 frame, then growing by what was sent, up to 25),
    # each delta whole frames
    assert [len(d) // FRAME_BYTES for d in deltas] == [1, 2, 4, 8, 16, 9]
    assert all(len(d) % FRAME_BYTES == 0 for d in deltas)
    assert_same_pcm(b"".join(deltas), pcm_40)
    assert events[-1]["usage"]["output_tokens"] == 40


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_first_audio_arrives_before_the_end_and_disconnect_cancels(openai_shim, triton, stream_format):
    """A 1900-frame utterance: one whole frame arrives, the engine is still generating; leaving the
    `with` block closes the connection, and the engine row and vocoder session are freed early."""
    before = triton.wait_for_metrics(triton.is_idle)
    assert triton.is_idle(before), before
    with sdk(openai_shim.url).audio.speech.with_streaming_response.create(
            model=MODEL, voice="default", input=TEXT, response_format="pcm", stream_format=stream_format,
            extra_body=fixed(1900, stream=True, initial_codec_chunk_frames=1)) as response:
        if stream_format == "sse":
            events = iter_sse(response)  # kept referenced, as `chunks` below
            event = next(events)
            assert event["type"] == "speech.audio.delta"
            first = base64.b64decode(event["audio"])
        else:
            first = b""
            # Kept referenced: a dropped generator is closed at once, and closing it closed the HTTP
            # response, which cancelled the stream before the metrics below could see it (a CI flake).
            chunks = response.iter_bytes()
            for data in chunks:
                first += data
                if len(first) >= FRAME_BYTES:
                    break
        assert len(first) >= FRAME_BYTES and len(first) % 4 == 0  # whole stereo samples, at least one frame
        # Gauges refresh a few times a second: wait for the snapshot that shows this stream.
        in_use = ('moss_engine{stat="streams"}', 'moss_engine{stat="running"}', 'moss_vocoder_sessions{state="active"}')
        during = triton.wait_for_metrics(lambda m: any(m[name] == 1 for name in in_use), timeout=30)
        assert any(during[name] == 1 for name in in_use), f"{during}\n{triton.log_tail()}"
    after = triton.wait_for_metrics(lambda m: triton.is_idle(m) and stopped_since(before, m))
    assert triton.is_idle(after)
    assert after['moss_engine{stat="requests_cancelled"}'] == before['moss_engine{stat="requests_cancelled"}'] + 1
    assert after['moss_engine{stat="frames_generated"}'] - before['moss_engine{stat="frames_generated"}'] < 1900
    assert after[STOPPED] == before[STOPPED] + 1  # ended by an in-band STOP, not a gRPC cancel


STOPPED = 'moss_tts_requests{stat="stopped"}'


def stopped_since(before, m) -> bool:
    """The engine aborted a request and moss_tts counted an in-band STOP since `before`."""
    return (m['moss_engine{stat="requests_cancelled"}'] > before['moss_engine{stat="requests_cancelled"}']
            and m[STOPPED] > before[STOPPED])


def test_disconnect_before_the_response_cancels_too(openai_shim, triton):
    """A non-streamed request whose client leaves while the server is still generating."""
    before = triton.wait_for_metrics(triton.is_idle)
    body = json.dumps({"input": TEXT, "stream": False, **fixed(1900)}).encode()
    port = int(openai_shim.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        running = triton.wait_for_metrics(lambda m: m['moss_engine{stat="running"}'] == 1)
        assert running['moss_engine{stat="running"}'] == 1
    after = triton.wait_for_metrics(lambda m: triton.is_idle(m) and stopped_since(before, m))
    assert triton.is_idle(after) and stopped_since(before, after)
    assert after['moss_engine{stat="frames_generated"}'] - before['moss_engine{stat="frames_generated"}'] < 1900


def test_models_and_health(openai_shim):
    ids = [model.id for model in sdk(openai_shim.url).models.list()]
    assert ids == ["moss-tts", "OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"]
    health = httpx.get(f"{openai_shim.url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


# --- MOSS fields -----------------------------------------------------------------------------------

def test_clone_from_data_uri_and_local_path_and_continuation(openai_shim):
    client = sdk(openai_shim.url)
    wav = tone_wav(1.2, 200.0)
    (openai_shim.reference_dir / "voice.wav").write_bytes(wav)

    def speak(**extra) -> bytes:
        return client.audio.speech.create(model=MODEL, voice="default", input=TEXT, response_format="pcm",
                                          extra_body=extra).content

    by_uri = speak(ref_audio=data_uri(wav), **fixed(6))
    by_path = speak(references=[{"audio_path": "voice.wav"}], **fixed(6))
    assert len(by_uri) == 6 * FRAME_BYTES
    assert_same_pcm(by_uri, by_path)  # same reference, same seed, same audio
    assert by_uri != speak(**fixed(6))  # the reference changes the voice
    continued = speak(task_type="continuation", ref_audio=data_uri(wav), ref_text="This was said. ", **fixed(4))
    assert len(continued) == 4 * FRAME_BYTES  # the reference's own audio is not returned


def test_every_sampling_field_is_accepted_and_seeded_output_repeats(openai_shim):
    extra = fixed(8, language="English", temperature=1.5, top_p=0.9, top_k=30, repetition_penalty=1.1,
                  text_temperature=0.8, text_top_p=0.95, text_top_k=40, initial_codec_chunk_frames=0)
    client = sdk(openai_shim.url)
    first = client.audio.speech.create(model=MODEL, voice="default", input=TEXT, response_format="pcm",
                                       instructions="Speak calmly.", extra_body={**extra, "token_count": 20})
    # the same duration as an inline prefix, the instructions as SGLang-Omni's body field
    again = client.audio.speech.create(model=MODEL, voice="default", input="${token:20}" + TEXT,
                                       response_format="pcm", extra_body={**extra, "instructions": "Speak calmly."})
    assert len(first.content) == 8 * FRAME_BYTES
    assert_same_pcm(first.content, again.content)


def test_stop_head_inputs_reach_the_public_entry(triton):
    """text_* -> STOP_* inputs of moss_tts (to the engine inside moss_tts)."""
    client = TTSClient(triton.grpc_url)
    values = {"TEXT": TEXT, "STOP_TEMPERATURE": 0.5, "STOP_TOP_P": 0.9, "STOP_TOP_K": 5, "SEED": 1, "MAX_FRAMES": 2,
              "IGNORE_STOP": True}
    assert client.synthesize(shim_inputs(values)).audio.shape == (2, 2 * SPF)
    with pytest.raises(InferenceServerException) as info:
        client.synthesize(shim_inputs({**values, "STOP_TOP_P": 1.5}))
    assert error_code(info.value) == "INVALID_ARGUMENT" and "stop top_p" in info.value.message()


# --- bad requests: documented 4xx, and everything keeps serving -------------------------------------

def _bad_cases():
    ok = {"model": MODEL, "input": TEXT}
    return [
        ("unknown field", {**ok, "foo": 1}, 400, "foo", "unknown field 'foo'"),
        ("unsupported SGLang field", {**ok, "stage_params": {}}, 400, "stage_params", "not supported"),
        ("missing input", {"model": MODEL}, 400, "input", "Field required"),
        ("empty input", {**ok, "input": ""}, 400, "input", "at least 1 character"),
        ("input over the limit", {**ok, "input": "x" * 1001}, 400, "input", "the limit is 1000"),
        ("wrong type", {**ok, "temperature": "hot"}, 400, "temperature", "valid number"),
        ("out of range", {**ok, "top_p": 1.5}, 400, "top_p", "less than or equal to 1"),
        ("int32 overflow", {**ok, "top_k": 2**32 + 5}, 400, "top_k", "less than or equal to 2147483647"),
        ("speed", {**ok, "speed": 1.5}, 400, "speed", "not supported"),
        ("preset voice", {**ok, "voice": "vivian"}, 400, "voice", "no preset voices"),
        ("unknown format", {**ok, "response_format": "ogg"}, 400, "response_format", "'ogg' is unknown"),
        ("opus at 22050 Hz", {**ok, "response_format": "opus", "sample_rate": 22050}, 400, "sample_rate",
         "opus carries 8000, 12000, 16000, 24000 or 48000 Hz, not 22050"),
        ("three channels", {**ok, "channels": 3}, 400, "channels", "channels must be 1 (mono, OpenAI's) or 2"),
        ("unknown model", {**ok, "model": "whisper-1"}, 404, "model", "not served here"),
        ("invalid JSON", b'{"input": "Hello', 400, None, "Invalid JSON"),
        ("body too large", {**ok, "input": "x" * 1_000_001}, 413, None, "--max-body-bytes"),
        ("reference too large", {**ok, "ref_audio": data_uri(b"x" * 200_001)}, 413, "ref_audio", "larger than"),
        ("not base64", {**ok, "ref_audio": "data:audio/wav;base64,***"}, 400, "ref_audio", "not valid base64"),
        ("URL references off", {**ok, "ref_audio": "https://example.com/a.wav"}, 400, "ref_audio", "are off"),
        ("path escape", {**ok, "references": [{"audio_path": "../../etc/passwd"}]}, 400, "references.0.audio_path",
         "outside the reference directory"),
        ("missing file", {**ok, "ref_audio": "nope.wav"}, 400, "ref_audio", "not a file"),
        ("undecodable reference", {**ok, "ref_audio": data_uri(b"RIFF this is not audio")}, 400, None,
         "could not be decoded (Format not recognised.)"),
        ("bad token prefix", {**ok, "input": "${token:abc}Hello"}, 400, None, "positive integer"),
        ("continuation without audio", {**ok, "task_type": "continuation"}, 400, "task_type", "needs the audio"),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("body, status, param, fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_request_gets_documented_4xx(openai_shim, body, status, param, fragment):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{openai_shim.url}/v1/audio/speech", content=content,
                          headers={"Content-Type": "application/json"}, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and fragment in error["message"], error
    assert_no_object_repr(error["message"])
    assert openai_shim.is_alive()


def test_long_form_text_through_the_sdk_is_every_segment_in_one_response(openai_shim):
    from moss_tts.contract.text_segments import split_text

    text = " ".join(f"Line {i} of a text long enough to be spoken in several segments." for i in range(14))
    assert len(text) <= 1000 and len(split_text(text)) >= 2  # the fixture's --max-input-chars is 1000
    pcm = sdk(openai_shim.url).audio.speech.create(model=MODEL, voice="default", input=text, response_format="pcm",
                                                   extra_body=fixed(3)).content
    assert len(pcm) == 3 * len(split_text(text)) * FRAME_BYTES  # max_new_tokens caps each segment


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_is_415(openai_shim, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = httpx.post(f"{openai_shim.url}/v1/audio/speech", content=json.dumps({"input": TEXT}).encode(),
                          headers=headers, timeout=60)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]
    ok = httpx.post(f"{openai_shim.url}/v1/audio/speech", json={"input": TEXT, **fixed(2), "response_format": "pcm"},
                    headers={"Content-Type": "application/json; charset=utf-8"}, timeout=60)
    assert ok.status_code == 200 and len(ok.content) == 2 * FRAME_BYTES


def test_sdk_raises_the_openai_error_types(openai_shim):
    client = sdk(openai_shim.url)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model=MODEL, voice="default", input=TEXT, speed=2.0)
    assert info.value.status_code == 400 and info.value.body["param"] == "speed"
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="whisper-1", voice="alloy", input=TEXT)


def test_shim_and_server_keep_serving_after_bad_requests(openai_shim, triton):
    assert openai_shim.is_alive() and triton.is_alive()
    response = sdk(openai_shim.url).audio.speech.create(model=MODEL, voice="default", input=TEXT,
                                                        response_format="pcm", extra_body=fixed(2))
    assert len(response.content) == 2 * FRAME_BYTES
    assert httpx.get(f"{openai_shim.url}/health").status_code == 200


# --- settings other than the fixture's (own subprocesses: grpc.aio keeps per-process state, so the
# test process itself never runs a gRPC-streaming shim) ----------------------------------------------

def test_url_reference_when_enabled(triton, tmp_path):
    wav = tone_wav(1.0, 300.0)
    files = HttpEndpoint(lambda: wav, "/voice.wav")
    shim = start_shim(triton.grpc_url, tmp_path / "shim.log", tmp_path, "--metrics-url", triton.metrics_url,
                      "--allow-url-references",
                      "--allow-private-url-hosts")
    try:
        response = sdk(shim.url).audio.speech.create(
            model=MODEL, voice="default", input=TEXT, response_format="pcm",
            extra_body=fixed(3, ref_audio=files.url))
    finally:
        stop_shim(shim)
        files.close()
    assert len(response.content) == 3 * FRAME_BYTES


def test_no_triton_response_in_time_is_504_and_cancels(triton, tmp_path):
    before = triton.wait_for_metrics(triton.is_idle)
    shim = start_shim(triton.grpc_url, tmp_path / "shim.log", tmp_path, "--metrics-url", triton.metrics_url,
                      "--response-timeout", "0.5")
    try:  # the first chunk needs 250 frames, far more than 0.5 s of work here
        response = httpx.post(f"{shim.url}/v1/audio/speech", json={"input": TEXT, **fixed(1900, stream=True,
                              response_format="pcm", initial_codec_chunk_frames=250)}, timeout=60)
    finally:
        stop_shim(shim)
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
    after = triton.wait_for_metrics(lambda m: triton.is_idle(m) and stopped_since(before, m))
    assert triton.is_idle(after) and stopped_since(before, after)


class LateProxy:
    """A TCP port that refuses connections until start(), then forwards them to `target`:
    tritonserver coming up after the shim did."""

    def __init__(self, target: str):
        self.host, self.port = "127.0.0.1", _free_port()
        self.target = target.rsplit(":", 1)[0], int(target.rsplit(":", 1)[1])

    def start(self) -> None:
        listener = socket.create_server((self.host, self.port))
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener) -> None:
        while True:
            client, _ = listener.accept()
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._connection, args=(client, upstream), daemon=True).start()

    @classmethod
    def _connection(cls, client, upstream) -> None:
        """Both directions, then both sockets closed: one direction's end only half-closes the other
        (a socket closed under the other pipe's recv would not wake it, and its number could be
        reused by the next connection)."""
        pipes = [threading.Thread(target=cls._pipe, args=(a, b), daemon=True)
                 for a, b in ((client, upstream), (upstream, client))]
        for pipe in pipes:
            pipe.start()
        for pipe in pipes:
            pipe.join()
        client.close()
        upstream.close()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def test_a_shim_started_before_tritonserver_is_healthy_soon_after_it(triton, tmp_path):
    """gRPC's default reconnect backoff grows to minutes: a shim that first found no server stayed
    503 for ~24 s after tritonserver was ready. Its backoff is capped at 1 s."""
    import time

    from shim_server import health_status

    proxy = LateProxy(triton.grpc_url)
    shim = start_shim(f"{proxy.host}:{proxy.port}", tmp_path / "shim.log", tmp_path, "--metrics-url",
                      triton.metrics_url, health=503)
    try:
        time.sleep(12)  # long enough for gRPC's default backoff to have grown past 10 s
        proxy.start()
        started = time.monotonic()
        while health_status(shim.url) != 200 and time.monotonic() - started < 30:
            time.sleep(0.1)
        took = time.monotonic() - started
        assert took < 3.0, f"/health took {took:.1f} s to turn 200 once tritonserver answered\n{shim.log_tail()}"
    finally:
        stop_shim(shim)
