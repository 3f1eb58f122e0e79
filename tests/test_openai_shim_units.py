"""The OpenAI-compatible shim without tritonserver: schema, mapping, references, errors, the app
around a fake stream (the audio conversion and encoders: test_openai_shim_audio.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from client.openai_shim import errors
from client.openai_shim.config import ConfigError, ShimConfig
from client.openai_shim.errors import ApiError
from client.openai_shim.references import load_reference
from client.openai_shim.schema import SpeechRequest, triton_options

SPF = 3840
WAV = b"RIFF....WAVEfake audio bytes"


def parse(**body) -> SpeechRequest:
    return SpeechRequest.model_validate_json(json.dumps({"input": "Hello.", **body}))


def rejected(**body) -> ApiError:
    with pytest.raises(ValidationError) as info:
        parse(**body)
    return errors.from_validation(info.value)


def sent(request: SpeechRequest) -> dict:
    return {name: value for name, value in triton_options(request).items() if value is not None}


# --- schema and the field -> Triton input mapping -------------------------------------------------

def test_minimal_request_sends_only_stream():
    request = parse()
    assert sent(request) == {"STREAM": True}
    assert request.response_format == "wav" and request.voice == "default" and request.is_streaming  # as OpenAI
    assert (request.output.sample_rate, request.output.channels) == (24000, 1)  # OpenAI's audio


def test_every_moss_field_maps_to_its_triton_input():
    request = parse(instructions="calm", language="English", token_count=40, temperature=0.9, top_p=0.7, top_k=20,
                    repetition_penalty=1.1, text_temperature=0.5, text_top_p=0.9, text_top_k=10, seed=3,
                    max_new_tokens=100, initial_codec_chunk_frames=2, ignore_stop=True, ref_audio="data:,x",
                    ref_text="ref words", task_type="continuation")
    assert sent(request) == {
        "INSTRUCTIONS": "calm", "LANGUAGE": "English", "TOKENS": 40, "TEMPERATURE": 0.9, "TOP_P": 0.7, "TOP_K": 20,
        "REPETITION_PENALTY": 1.1, "STOP_TEMPERATURE": 0.5, "STOP_TOP_P": 0.9, "STOP_TOP_K": 10, "SEED": 3,
        "MAX_FRAMES": 100, "FIRST_CHUNK_FRAMES": 2, "IGNORE_STOP": True, "REFERENCE_TEXT": "ref words",
        "MODE": "continuation", "STREAM": True}
    assert request.reference == ("ref_audio", "data:,x")


def test_aliases_and_defaults_that_send_nothing():
    assert sent(parse(language="auto", initial_codec_chunk_frames=0, task_type="clone")) == {"STREAM": True}
    assert sent(parse(duration_tokens=12))["TOKENS"] == 12 and sent(parse(tokens=13))["TOKENS"] == 13
    assert sent(parse(audio_temperature=1.2, audio_top_k=5))["TEMPERATURE"] == 1.2
    assert sent(parse(temperature=1.2, audio_temperature=1.2))["TEMPERATURE"] == 1.2  # equal values agree
    assert parse(speaker="Nova").voice == "Nova"  # SGLang-Omni's alias, OpenAI names in any case
    assert parse(voice="Nova").saved_voice is None  # OpenAI's names mean "no reference"
    assert parse(voice="narrator").saved_voice == "narrator"  # a saved voice, resolved by the app
    assert parse(voice={"id": "voice_1234"}).saved_voice == "voice_1234"
    request = parse(references=[{"audio_path": "v.wav", "text": "words"}])
    assert request.reference == ("references.0.audio_path", "v.wav") and sent(request)["REFERENCE_TEXT"] == "words"


def test_streaming_switches():
    assert parse().is_streaming and parse(stream=True).is_streaming and parse(stream_format="sse").is_streaming
    assert not parse(stream=False).is_streaming and not parse(stream=False, response_format="mp3").is_streaming


@pytest.mark.parametrize("name", ["pcm", "wav", "flac", "mp3", "opus", "aac"])
def test_every_format_streams_and_the_native_stream_is_an_extension_away(name):
    assert parse(response_format=name, stream=True).is_streaming
    assert parse(response_format=name, stream_format="sse").is_streaming
    native = parse(response_format=name, sample_rate=48000, channels=2).output
    assert (native.format.name, native.sample_rate, native.channels, native.is_native) == (name, 48000, 2, True)


@pytest.mark.parametrize("body, param, fragment", [
    (dict(foo=1), "foo", "unknown field 'foo'"),
    (dict(x_vector_only_mode=True), "x_vector_only_mode", "not supported by this server"),
    (dict(references=[{"audio": "data:,x", "vq_codes": [1]}]), "references.0.vq_codes", "unknown field"),
    (dict(references=[{"text": "only text"}]), "references.0", "exactly one of audio_path"),
    (dict(references=[{"audio": "a"}, {"audio": "b"}]), "references", "at most 1"),
    (dict(input=""), "input", "at least 1 character"),
    (dict(max_new_tokens="8"), "max_new_tokens", "valid integer"),
    (dict(seed=-1), "seed", "greater than or equal to 0"),
    (dict(top_p=0.0), "top_p", "greater than 0"),
    (dict(top_k=-2), "top_k", "greater than or equal to -1"),
    (dict(initial_codec_chunk_frames=251), "initial_codec_chunk_frames", "less than or equal to 250"),
    (dict(speed=1.25), "speed", "no speed control"),
    (dict(voice={"name": "x"}), "voice", 'or {"id": "voice_..."}'),
    (dict(voice="vivian", ref_audio="data:,x"), "voice", "a saved voice is a reference already"),
    (dict(response_format="ogg"), "response_format", "is unknown"),
    (dict(response_format="opus", sample_rate=22050), "sample_rate",
     "opus carries 8000, 12000, 16000, 24000 or 48000 Hz, not 22050"),
    (dict(sample_rate=96000), "sample_rate", "not 96000; leave sample_rate out for 24000"),
    (dict(channels=6), "channels", "channels must be 1 (mono, OpenAI's) or 2"),
    (dict(sample_rate="48000"), "sample_rate", "valid integer"),
    (dict(stream_format="websocket"), "stream_format", "'audio' or 'sse'"),
    (dict(task_type="Base"), "task_type", "must be one of"),
    (dict(stream=False, stream_format="sse"), "stream", "always streams"),
    (dict(task_type="continuation"), "task_type", "needs the audio to continue"),
    (dict(ref_text="words"), "ref_text", "give ref_audio too"),
    (dict(ref_audio="a", references=[{"audio": "b"}]), "ref_audio", "not both"),
    (dict(token_count=10, tokens=11), "tokens", "disagree"),
    (dict(temperature=1.0, audio_temperature=1.5), "audio_temperature", "disagree"),
])
def test_schema_rejections_name_the_field(body, param, fragment):
    error = rejected(**body)
    assert (error.status, error.param) == (400, param), error.message
    assert fragment in error.message
    assert error.code == ("unknown_parameter" if "unknown field" in fragment or "not supported by" in fragment
                          else "invalid_value")


def test_all_unknown_fields_are_named_at_once():
    error = rejected(foo=1, bar=2)
    assert "'foo'" in error.message and "'bar'" in error.message


# --- references -----------------------------------------------------------------------------------

def load(source: str, config: ShimConfig, param: str = "ref_audio") -> bytes:
    return asyncio.run(load_reference(param, source, config))


def load_error(source: str, config: ShimConfig) -> ApiError:
    with pytest.raises(ApiError) as info:
        load(source, config)
    return info.value


def data_uri(data: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(data).decode()


def test_data_uri_references():
    config = ShimConfig(max_reference_bytes=100)
    assert load(data_uri(WAV), config) == WAV
    assert load_error("data:audio/wav;base64,@@notbase64@@", config).status == 400
    assert "data:audio/wav;base64" in load_error("data:audio/wav,rawbytes", config).message
    error = load_error(data_uri(b"x" * 101), config)
    assert (error.status, error.code, error.param) == (413, "reference_too_large", "ref_audio")


@pytest.fixture
def ref_dir(tmp_path):
    refs = tmp_path / "refs"
    (refs / "sub").mkdir(parents=True)
    (refs / "sub" / "voice.wav").write_bytes(WAV)
    (tmp_path / "secret.wav").write_bytes(b"outside")
    (refs / "inside_link.wav").symlink_to(refs / "sub" / "voice.wav")
    (refs / "escape_link.wav").symlink_to(tmp_path / "secret.wav")
    (refs / "escape_dir").symlink_to(tmp_path)
    return refs


def test_local_paths_only_inside_the_reference_dir(ref_dir):
    config = ShimConfig(reference_dir=ref_dir, max_reference_bytes=1000)
    assert load("sub/voice.wav", config) == WAV
    assert load(str(ref_dir / "sub" / "voice.wav"), config) == WAV
    assert load(f"file://{ref_dir}/sub/voice.wav", config) == WAV
    assert load("inside_link.wav", config) == WAV  # a symlink that stays inside is fine
    for escape in ("../secret.wav", "sub/../../secret.wav", str(ref_dir.parent / "secret.wav"), "escape_link.wav",
                   "escape_dir/secret.wav", f"file://{ref_dir.parent}/secret.wav"):
        error = load_error(escape, config)
        assert error.status == 400 and "outside the reference directory" in error.message, escape
    assert "not a file" in load_error("sub", config).message
    assert "not a file" in load_error("missing.wav", config).message
    assert load_error("bad\x00name.wav", config).status == 400
    (ref_dir / "big.wav").write_bytes(b"x" * 1001)
    assert load_error("big.wav", config).status == 413


def test_local_paths_are_off_without_a_reference_dir():
    assert "local paths are off" in load_error("voice.wav", ShimConfig()).message
    assert "unsupported scheme" in load_error("ftp://example.com/voice.wav", ShimConfig()).message


class _Files(BaseHTTPRequestHandler):
    release = threading.Event()

    def do_GET(self):
        if self.path == "/voice.wav":
            self._send(200, WAV)
        elif self.path == "/big.wav":
            self._send(200, b"x" * 5000)
        elif self.path == "/chunked-big.wav":  # no Content-Length: the limit is enforced while reading
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(10):
                self.wfile.write(b"3e8\r\n" + b"x" * 1000 + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/voice.wav")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/slow.wav":
            self.release.wait(10)  # until the test has seen the timeout
            self._send(200, WAV)
        else:
            self._send(404, b"")

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def file_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Files.release.set()
    server.shutdown()
    server.server_close()
    _Files.release.clear()


def test_url_references_off_by_default_and_private_hosts_blocked(file_server):
    assert "URL references are off" in load_error(f"{file_server}/voice.wav", ShimConfig()).message
    error = load_error(f"{file_server}/voice.wav", ShimConfig(allow_url_references=True))
    assert error.status == 400 and "loopback/private" in error.message


def test_url_references_with_limits(file_server):
    config = ShimConfig(allow_url_references=True, allow_private_url_hosts=True, max_reference_bytes=4000,
                        url_timeout_s=0.5)
    assert load(f"{file_server}/voice.wav", config) == WAV
    assert load_error(f"{file_server}/big.wav", config).status == 413
    assert load_error(f"{file_server}/chunked-big.wav", config).status == 413
    assert "redirects are not followed" in load_error(f"{file_server}/redirect", config).message
    assert "HTTP 404" in load_error(f"{file_server}/missing.wav", config).message
    assert "within 0.5 s" in load_error(f"{file_server}/slow.wav", config).message


# --- errors and config ----------------------------------------------------------------------------

@pytest.mark.parametrize("message, status, code", [
    ("[INVALID_ARGUMENT] input TEXT is empty", 400, "invalid_value"),
    ("in ensemble 'moss_tts_codes', [INVALID_ARGUMENT] reference could not be decoded", 400, "invalid_value"),
    ("[UNAVAILABLE] server busy: too many concurrent streams", 429, "rate_limit_exceeded"),
    ("[UNAVAILABLE] server busy: queue full (64 waiting)", 429, "rate_limit_exceeded"),
    ("[UNAVAILABLE] vocoder has no free session", 503, "service_unavailable"),
    ("[CANCELLED] request cancelled", 503, "service_unavailable"),
    ("[INTERNAL] boom", 500, "internal_error"),
    ("Stub process is not healthy.", 503, "service_unavailable"),  # Triton's own, for a dead stub
    ("Stub process 'moss_tts_0_0' is not healthy.", 503, "service_unavailable"),
    ("[UNAVAILABLE] Stub process 'vocoder_0_0' is not healthy.", 503, "service_unavailable"),
    ("[UNAVAILABLE] Model ref_encoder - Error when running inference: [request id: <id_unknown>] Exceeds maximum "
     "queue size", 429, "rate_limit_exceeded"),
])
def test_triton_errors_map_to_openai_statuses(message, status, code):
    error = errors.from_triton_message(message)
    assert (error.status, error.code) == (status, code)
    assert not error.message.startswith("[") and "in ensemble" not in error.message
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def noise(frames: int) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((2, frames * SPF)) * 0.1).astype(np.float32)


def test_openai_model_names_are_aliases_unless_turned_off():
    config = ShimConfig()
    assert config.served_names == ("moss-tts", "OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5", "tts-1", "tts-1-hd",
                                   "gpt-4o-mini-tts")
    assert all(config.serves(name) for name in ("moss-tts", "tts-1", "gpt-4o-mini-tts")) and not config.serves("x")
    assert ShimConfig(model_aliases=()).served_names == ShimConfig().model_names
    assert ShimConfig(model_names=("a",), model_aliases=("a", "b")).served_names == ("a", "b")


def test_alias_flags():
    from client.openai_shim.__main__ import model_aliases, parse_args

    assert model_aliases(parse_args([])) == ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
    assert model_aliases(parse_args(["--model-alias", "my-tts"])) == ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "my-tts")
    assert model_aliases(parse_args(["--no-openai-model-names", "--model-alias", "a", "--model-alias", "b"])) == ("a", "b")
    assert model_aliases(parse_args(["--no-openai-model-names"])) == ()


def test_config_is_validated_once(tmp_path):
    assert ShimConfig(reference_dir=tmp_path / ".").reference_dir == tmp_path.resolve()
    for bad in (dict(port=70000), dict(max_body_bytes=0), dict(response_timeout_s=float("nan")), dict(ws_max_contexts=0),
                dict(model_names=()), dict(model_aliases=(" ",)), dict(reference_dir=tmp_path / "missing")):
        with pytest.raises(ConfigError):
            ShimConfig(**bad)


def test_unreachable_triton_is_503_and_unknown_routes_are_openai_json(tmp_path):
    from shim_server import start_shim, stop_shim

    shim = start_shim("127.0.0.1:1", tmp_path / "shim.log", tmp_path, health=503)  # nothing listens there
    try:
        health = httpx.get(f"{shim.url}/health")
        speech = httpx.post(f"{shim.url}/v1/audio/speech", json={"model": "moss-tts", "input": "Hello."}, timeout=30)
        missing = httpx.get(f"{shim.url}/v1/nothing")
        wrong_method = httpx.get(f"{shim.url}/v1/audio/speech")
    finally:
        stop_shim(shim)
    assert health.status_code == 503 and health.json()["error"]["code"] == "service_unavailable"
    assert speech.status_code == 503 and "unreachable" in speech.json()["error"]["message"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"


# --- the app around a fake Triton stream ----------------------------------------------------------

class FakeStream:
    """Yields `chunks`, then ends, fails ("error") or waits forever ("hang"); records aclose()."""

    def __init__(self, chunks, then="end"):
        self.chunks, self.then = list(chunks), then
        self.closed = threading.Event()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.chunks:
            return self.chunks.pop(0)
        if self.then == "error":
            raise errors.from_triton_message("[INTERNAL] the vocoder failed")
        if self.then == "hang":
            await asyncio.Event().wait()
        raise StopAsyncIteration

    async def aclose(self):
        self.closed.set()


class FakeTriton:
    def __init__(self, stream: FakeStream):
        self.stream, self.values = stream, None

    def open(self, values):
        self.values = values
        return self.stream

    async def problem(self, timeout_s):
        return None

    async def close(self):
        pass


def fake_shim(stream: FakeStream):
    from shim_server import ShimThread

    triton = FakeTriton(stream)
    return triton, ShimThread(ShimConfig(metrics_url=""), triton)


def test_the_app_sends_the_mapped_inputs_and_the_reference_bytes():
    triton, shim = fake_shim(FakeStream([noise(2)]))
    with shim as url:
        response = httpx.post(f"{url}/v1/audio/speech", json={"input": "Hi.", "ref_audio": data_uri(WAV), "seed": 5,
                                                              "response_format": "pcm"})
    assert response.status_code == 200 and len(response.content) == 2 * 1920 * 2  # 2 frames, 24 kHz mono s16le
    assert triton.values["TEXT"] == "Hi." and triton.values["REFERENCE_AUDIO"] == WAV and triton.values["SEED"] == 5
    assert triton.stream.closed.is_set()


def test_error_mid_stream_is_an_sse_error_event():
    triton, shim = fake_shim(FakeStream([noise(1)], then="error"))
    with shim as url:
        response = httpx.post(f"{url}/v1/audio/speech", json={"input": "Hi.", "stream_format": "sse",
                                                              "response_format": "pcm"})
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta", "error"]
    assert events[1]["error"]["code"] == "internal_error" and "vocoder failed" in events[1]["error"]["message"]


def test_error_mid_stream_cuts_a_raw_stream():
    triton, shim = fake_shim(FakeStream([noise(1)], then="error"))
    received = b""
    with shim as url, pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", f"{url}/v1/audio/speech", json={"input": "Hi.", "stream": True, "sample_rate": 48000,
                                                                  "channels": 2, "response_format": "pcm"}) as response:
            for data in response.iter_bytes():
                received += data
    assert len(received) == SPF * 4  # the chunk before the failure arrived; then no clean end


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_client_leaving_mid_stream_closes_the_triton_stream(stream_format):
    triton, shim = fake_shim(FakeStream([noise(1)], then="hang"))
    with shim as url:
        with httpx.stream("POST", f"{url}/v1/audio/speech", json={"input": "Hi.", "stream": True,
                          "stream_format": stream_format, "response_format": "pcm"}) as response:
            # Keep the iterator: a bare next(response.iter_bytes()) lets the generator be collected
            # at once, and closing it closes the connection, so the shim saw a real disconnect
            # before this assert ran (the test's old flake, 1 in 5 runs).
            chunks = response.iter_bytes()
            next(chunks)
            assert not triton.stream.closed.is_set()
        assert triton.stream.closed.wait(10)


def test_the_start_up_freeze_does_not_keep_dead_cycles():
    """The shim freezes what exists at start-up out of the collector's sight; garbage waiting for
    a collection then (a dead reference cycle) must be collected first, not frozen for the life of
    the process (an earlier shim's hung response kept a soxr resampler past the interpreter)."""
    import gc
    import weakref

    from client.openai_shim.app import create_app

    class Node:
        pass

    def dead_cycle():
        node = Node()
        node.me = node
        return weakref.ref(node)

    app = create_app(ShimConfig(metrics_url=""), FakeTriton(FakeStream([])))
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection may free the cycle before the start-up's
    try:
        ref = dead_cycle()

        async def start_and_stop():
            async with app.router.lifespan_context(app):
                pass

        asyncio.run(start_and_stop())
        gc.unfreeze()  # what this test froze goes back to the collector's sight
        assert ref() is None
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
