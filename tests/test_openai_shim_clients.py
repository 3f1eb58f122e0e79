"""What the voice-agent frameworks send, answered as they expect: the exact request bodies of Pipecat
1.14.0's and LiveKit 1.8.9's OpenAI TTS (read from their source and recorded by
scripts/check_agents.sh), sent through the official `openai` SDK as they send them, against the real
server; the bytes decoded and compared with the server's own frame count.

The frameworks themselves (numpy 2) are not installed here: scripts/check_agents.sh runs them.
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from shim_server import start_shim, stop_shim
from test_openai_shim import TEXT, fixed, iter_sse, sdk
from test_openai_shim_audio import decodable, decoded

pytestmark = pytest.mark.triton

FRAMES = 'moss_engine{stat="frames_generated"}'
SPF_24K = 1920  # samples per 80 ms frame at 24 kHz
# The bodies, minus `input` (captured by scripts/check_agents.sh --bodies; see the frameworks' tts.py).
PIPECAT = {"model": "gpt-4o-mini-tts", "voice": "alloy", "response_format": "pcm"}  # no stream, no speed
LIVEKIT = {"model": "gpt-4o-mini-tts", "voice": "ash", "response_format": "mp3", "speed": 1.0, "stream_format": "sse"}
LIVEKIT_TTS_1 = {**LIVEKIT, "model": "tts-1", "stream_format": "audio"}  # its raw-audio path


def exchange(shim, body: dict) -> tuple[httpx.Response, bytes]:
    """The request as the SDK sends it (with_streaming_response, as both frameworks do); -> (response,
    the audio bytes: the body, or the SSE deltas joined)."""
    client = sdk(shim.url)
    extra = {k: v for k, v in body.items() if k not in ("model", "voice", "response_format", "speed",
                                                          "stream_format", "instructions")}
    known = {k: v for k, v in body.items() if k not in extra}
    with client.audio.speech.with_streaming_response.create(input=TEXT, extra_body=extra or None, **known) as response:
        if response.headers["content-type"].startswith("text/event-stream"):
            events = list(iter_sse(response))
            assert events[-1]["type"] == "speech.audio.done", events[-1]
            audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
        else:
            audio = response.read()
    return response.http_response, audio


def duration_s(audio: bytes, name: str) -> float:
    if name == "pcm" or not audio:
        return len(audio) / 2 / 24000
    samples, rate, _ = decoded(audio, name)
    return samples / rate


def assert_openai_audio(response: httpx.Response, audio: bytes, name: str, frames: int) -> None:
    """24 kHz mono as the headers say, as long as the server's frames (codec padding: under a frame)."""
    assert (response.headers["x-sample-rate"], response.headers["x-channels"]) == ("24000", "1")
    if name != "pcm" and audio:
        _, rate, channels = decoded(audio, name)
        assert channels == 1 and rate == (48000 if name == "opus" else 24000)  # Opus decoders run at 48 kHz
    assert frames * 0.08 <= duration_s(audio, name) < frames * 0.08 + 0.08


@pytest.mark.parametrize("body, name", [(PIPECAT, "pcm"), (LIVEKIT, "mp3"), (LIVEKIT_TTS_1, "mp3"),
                                        ({**LIVEKIT, "response_format": "pcm"}, "pcm"),
                                        ({**LIVEKIT, "response_format": "wav"}, "wav")],
                         ids=["pipecat", "livekit", "livekit-tts-1", "livekit-pcm", "livekit-wav"])
def test_the_frameworks_exact_requests_get_audio_of_the_servers_length(openai_shim, triton, body, name):
    """Nothing but what the framework sends: the length is the tiny model's own (it stops at random),
    read from the server's frame counter."""
    before = triton.settled_metrics()
    response, audio = exchange(openai_shim, body)
    frames = int(triton.settled_metrics()[FRAMES] - before[FRAMES])
    assert response.status_code == 200
    assert_openai_audio(response, audio, name, frames)
    if name == "pcm":
        assert len(audio) == frames * SPF_24K * 2  # exact: the resampler's tail is flushed at the end


@pytest.mark.parametrize("body, name", [(PIPECAT, "pcm"), (LIVEKIT, "mp3"), (LIVEKIT_TTS_1, "mp3"),
                                        ({**LIVEKIT, "response_format": "wav"}, "wav"),
                                        ({**LIVEKIT, "response_format": "opus"}, "opus"),
                                        ({**LIVEKIT, "response_format": "aac"}, "aac"),
                                        ({**LIVEKIT, "response_format": "flac"}, "flac")],
                         ids=["pipecat", "livekit", "livekit-tts-1", "livekit-wav", "opus", "aac", "flac"])
def test_the_frameworks_requests_of_a_known_length(openai_shim, body, name):
    """The same bodies + the extension fields that fix the length (12 frames, 0.96 s)."""
    response, audio = exchange(openai_shim, {**body, **fixed(12, native=False)})
    assert response.status_code == 200
    assert_openai_audio(response, audio, name, 12)


def test_pcm_is_the_resampled_native_stream(openai_shim):
    """Default pcm = the native stream (one extension away) downmixed and resampled: the same signal."""
    from client.openai_shim.audio_convert import convert_whole

    native = sdk(openai_shim.url).audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm",
                                                      extra_body=fixed(10)).content
    default = sdk(openai_shim.url).audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm",
                                                       extra_body=fixed(10, native=False)).content
    stereo = np.frombuffer(native, "<i2").reshape(-1, 2).T.astype(np.float32) / 32767.0
    expected = np.rint(np.clip(convert_whole(stereo, 24000, 1)[:, 0], -1, 1) * 32767)
    assert len(native) == 10 * 3840 * 4 and len(default) == 10 * SPF_24K * 2
    # the vocoder's rounding varies by a step of 16 bits between runs, and so does the re-quantised native
    assert np.abs(np.frombuffer(default, "<i2") - expected).max() <= 2


@pytest.mark.parametrize("name", ["pcm", "wav", "flac", "mp3", "opus", "aac"])
@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_every_format_streams_its_first_audio_while_the_server_still_generates(openai_shim, triton, name,
                                                                              stream_format):
    """A 1900-frame utterance at the server's default chunking: the first bytes (raw read or SSE delta)
    decode to audio while the engine is still running; leaving cancels it."""
    body = {"model": "gpt-4o-mini-tts", "voice": "ash", "input": TEXT, "response_format": name,
            "stream_format": stream_format, **fixed(1900, native=False)}
    before = triton.wait_for_metrics(triton.is_idle)
    with httpx.stream("POST", f"{openai_shim.url}/v1/audio/speech", json=body, timeout=120) as response:
        assert response.status_code == 200
        # kept referenced: a dropped generator closes the response
        pieces = response.iter_bytes() if stream_format == "audio" else (
            base64.b64decode(event["audio"]) for event in iter_sse(response))
        received = b""
        for data in pieces:  # until the bytes decode to audio (a read may end mid-packet)
            received += data
            if decodable(received, name):
                break
        assert decodable(received, name) > 0
        running = triton.wait_for_metrics(lambda m: m['moss_engine{stat="running"}'] == 1)
        assert running['moss_engine{stat="running"}'] == 1
    after = triton.wait_for_metrics(lambda m: triton.is_idle(m) and m[FRAMES] > before[FRAMES])
    assert after[FRAMES] - before[FRAMES] < 1900


def test_openai_model_names_are_served_and_listed_and_can_be_turned_off(openai_shim, triton, tmp_path):
    ids = [model.id for model in sdk(openai_shim.url).models.list()]
    assert ids == ["moss-tts", "OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"]
    for model in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts"):
        audio = sdk(openai_shim.url).audio.speech.create(model=model, voice="nova", input=TEXT, response_format="pcm",
                                                         extra_body=fixed(2, native=False)).content
        assert len(audio) == 2 * SPF_24K * 2
    shim = start_shim(triton.grpc_url, tmp_path / "shim.log", tmp_path, "--metrics-url", triton.metrics_url,
                      "--no-openai-model-names", "--model-alias", "house-tts")
    try:
        assert [m.id for m in sdk(shim.url).models.list()][2:] == ["house-tts"]
        with pytest.raises(openai.NotFoundError) as info:
            sdk(shim.url).audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        assert "house-tts" in str(info.value)
    finally:
        stop_shim(shim)


def test_a_whole_response_has_completed_headers(openai_shim):
    """stream=false: one body with a Content-Length; the flac knows its length, the mp3 carries its
    LAME frame (exact decoded length), the wav its sizes."""
    for name in ("flac", "mp3", "wav"):
        response = httpx.post(f"{openai_shim.url}/v1/audio/speech", timeout=120, json={
            "input": TEXT, "response_format": name, "stream": False, **fixed(8, native=False)})
        assert int(response.headers["content-length"]) == len(response.content)
        assert decoded(response.content, name) == (8 * SPF_24K, 24000, 1)


def test_the_websocket_sends_the_same_pcm_openais_by_default(openai_shim):
    """One session, two segments: 24 kHz mono, as session.started says, exactly frames x 1920 samples
    (the resampler runs across the segments and its tail comes before `done`)."""
    from websockets.sync.client import connect

    from test_openai_shim_ws import read_all, send, start, ws_url

    with connect(ws_url(openai_shim)) as ws:
        started = start(ws, seed=5, max_new_tokens=4, ignore_stop=True)
        assert (started["response_format"], started["sample_rate"], started["channels"]) == ("pcm", 24000, 1)
        send(ws, type="text", text="First sentence here. And a second one.")
        send(ws, type="end")
        audio, events, _ = read_all(ws)
    assert events[-1] == {"type": "done", "segments": 2, "frames": 8}
    assert len(audio) == 8 * SPF_24K * 2
