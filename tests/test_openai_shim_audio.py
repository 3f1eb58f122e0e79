"""The shim's audio path without a server: 48 kHz stereo chunks -> a response's rate, channels and
format (client/openai_shim/audio_convert.py, audio_encode.py, audio_output.py).

Tolerance of streamed against whole conversion, promised by audio_convert.py: 1e-6 per float sample
(soxr's stream is measured bit-identical, 0), so the 16-bit bytes are equal.
"""

from __future__ import annotations

import io
import threading

import av
import numpy as np
import pytest
import soundfile as sf

from client.openai_shim import audio_output
from client.openai_shim.audio_convert import StreamConverter, convert_whole, downmix
from client.openai_shim.audio_encode import to_pcm16
from client.openai_shim.audio_format import FORMATS, SAMPLE_RATES, OutputSpec
from client.openai_shim.audio_output import NO_AUDIO, AudioOutput, encode_whole

SPF = 3840  # samples per frame per channel at 48 kHz
TOLERANCE = 1e-6  # streamed vs whole conversion, per float sample
SCHEDULE = [2, 4, 8, 16, 25, 25]  # the server's chunk sizes in frames (first 2, growing to 25)
DEMUXERS = {"wav": "wav", "flac": "flac", "mp3": "mp3", "opus": "ogg", "aac": "aac"}
CODECS = ["flac", "mp3", "opus", "aac"]


def noise(frames: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((2, frames * SPF)) * 0.1).astype(np.float32)


def chunks_of(audio: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """`audio` cut at the given sizes (in samples), the remainder last."""
    cuts = np.cumsum(sizes)
    return np.split(audio, cuts[cuts < audio.shape[1]], axis=1)


def streamed(converter: StreamConverter, pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([converter.push(piece) for piece in pieces] + [converter.finish()])


def decoded(data: bytes, name: str) -> tuple[int, int, int]:
    """(samples per channel, rate, channels) of a response body, decoded by FFmpeg."""
    container = av.open(io.BytesIO(data), format=DEMUXERS[name])
    stream = container.streams.audio[0]
    samples = sum(frame.samples for frame in container.decode(stream))
    return samples, stream.codec_context.sample_rate, stream.codec_context.channels


def decodable(data: bytes, name: str) -> int:
    """Samples per channel a player gets from the bytes received so far (0 while none decode yet)."""
    if name == "pcm":
        return len(data) // 2
    try:
        return decoded(data, name)[0]
    except (av.error.FFmpegError, IndexError):  # too little yet: no stream found, or a packet cut short
        return 0


def spec(name: str, rate: int = 24000, channels: int = 1) -> OutputSpec:
    return OutputSpec.of(name, rate, channels)


# --- conversion ------------------------------------------------------------------------------------

def test_downmix_is_the_mean_and_stereo_is_interleaved():
    audio = np.array([[0.5, 1.0, -1.0], [0.1, 1.0, 1.0]], np.float32)
    assert downmix(audio, 1)[:, 0].tolist() == pytest.approx([0.3, 1.0, 0.0])
    assert downmix(audio, 2).tolist() == audio.T.tolist() and downmix(audio, 2).flags.c_contiguous


@pytest.mark.parametrize("rate", SAMPLE_RATES)
@pytest.mark.parametrize("channels", [1, 2])
def test_chunked_resampling_equals_whole_and_has_the_exact_length(rate, channels):
    audio = noise(80)
    whole = convert_whole(audio, rate, channels)
    assert whole.shape == (80 * SPF * rate // 48000, channels)
    rng = np.random.default_rng(rate)
    for sizes in ([frames * SPF for frames in SCHEDULE], list(rng.integers(1, 9000, 100)), [1] * 50 + [SPF] * 4):
        chunked = streamed(StreamConverter(rate, channels), chunks_of(audio, sizes))
        assert chunked.shape == whole.shape
        assert np.abs(chunked - whole).max() <= TOLERANCE
        assert to_pcm16(chunked) == to_pcm16(whole)


def test_resampling_keeps_a_tone_and_adds_no_click_at_chunk_borders():
    t = np.arange(40 * SPF) / 48000
    tone = np.stack([0.5 * np.sin(2 * np.pi * 440 * t)] * 2).astype(np.float32)
    out = streamed(StreamConverter(24000, 1), chunks_of(tone, [frames * SPF for frames in SCHEDULE]))[:, 0]
    expected = 0.5 * np.sin(2 * np.pi * 440 * np.arange(len(out)) / 24000)
    inner = slice(2400, -2400)  # away from the filter's start and end transients
    assert np.abs(out[inner] - expected[inner]).max() < 1e-3
    assert np.abs(np.diff(out[inner])).max() <= np.abs(np.diff(expected)).max() * 1.01  # no jump anywhere


def test_the_native_stream_is_passed_through():
    audio = noise(3)
    converter = StreamConverter(48000, 2)
    assert np.array_equal(converter.push(audio), audio.T) and converter.finish().shape == (0, 2)


# --- formats: pcm, wav ------------------------------------------------------------------------------

def test_pcm16_is_interleaved_clipped_and_rounded():
    samples = np.array([[0.5, -0.5], [-2.0, 2.0], [1.0, 0.0]], np.float32)
    assert np.frombuffer(to_pcm16(samples), "<i2").tolist() == [16384, -16384, -32767, 32767, 32767, 0]


@pytest.mark.parametrize("rate, channels", [(24000, 1), (48000, 2), (16000, 2)])
def test_pcm_and_wav_streamed_and_whole(rate, channels):
    audio = noise(12)
    expected = to_pcm16(convert_whole(audio, rate, channels))
    for name in ("pcm", "wav"):
        output = AudioOutput(spec(name, rate, channels))
        data = b"".join([output.push(piece) for piece in chunks_of(audio, [2 * SPF, 4 * SPF])] + [output.finish()])
        whole = encode_whole(audio, spec(name, rate, channels))
        assert output.num_frames == 12
        if name == "pcm":
            assert data == whole == expected
            continue
        assert data[4:8] == b"\xff\xff\xff\xff" and data[44:] == expected  # streamed: length unknown
        assert whole[44:] == expected and int.from_bytes(whole[40:44], "little") == len(expected)
        for body in (data, whole):
            read, read_rate = sf.read(io.BytesIO(body), dtype="int16")
            assert read_rate == rate and read.reshape(len(read), -1).shape == (12 * SPF * rate // 48000, channels)


def test_a_streamed_wav_without_audio_is_its_header():
    output = AudioOutput(spec("wav"))
    header = output.push(NO_AUDIO)
    assert len(header) == 44 and header[:4] == b"RIFF" and output.finish() == b""


# --- formats through FFmpeg --------------------------------------------------------------------------

def test_every_openai_format_has_an_encoder():
    assert set(FORMATS) == {"pcm", "wav", "flac", "mp3", "opus", "aac"}
    assert FORMATS["opus"].sample_rates == (8000, 12000, 16000, 24000, 48000)  # libopus's rates


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("rate, channels", [(24000, 1), (48000, 2), (16000, 1)])
def test_codecs_stream_to_the_declared_rate_channels_and_length(name, rate, channels):
    audio = noise(40)
    output = AudioOutput(spec(name, rate, channels))
    data = b"".join([output.push(piece) for piece in chunks_of(audio, [f * SPF for f in SCHEDULE])] + [output.finish()])
    for body in (data, encode_whole(audio, spec(name, rate, channels))):
        samples, got_rate, got_channels = decoded(body, name)
        decoder_rate = 48000 if name == "opus" else rate  # Opus decoders always run at 48 kHz
        assert (got_rate, got_channels) == (decoder_rate, channels)
        length_s = samples / decoder_rate
        assert 40 * 0.08 <= length_s < 40 * 0.08 + 0.08, length_s  # codec padding: less than one frame
    if name == "flac":  # lossless: the 16-bit samples themselves (libsndfile cannot read a streamed FLAC:
        # its STREAMINFO has no length, which sf.read takes for 2**63 frames; FFmpeg reads to the end)
        container = av.open(io.BytesIO(data), format="flac")
        read = np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)  # packed s16
        assert read.astype("<i2").tobytes() == to_pcm16(convert_whole(audio, rate, channels))


@pytest.mark.parametrize("name", ["pcm", "wav"] + CODECS)
@pytest.mark.parametrize("rate, channels", [(24000, 1), (48000, 2), (16000, 1)])
def test_first_bytes_leave_with_the_first_chunk(name, rate, channels):
    """The server's first chunk (2 frames) is audio a decoder plays at once, in every format; from a
    1-frame first chunk, LAME's and AAC's look-ahead (~1,100 and 2,048 samples) can hold the audio
    until the second chunk, never later."""
    output = AudioOutput(spec(name, rate, channels))
    first = output.push(noise(2))
    if name == "pcm":
        assert len(first) >= 2 * 0.8 * SPF * rate // 48000 * channels * 2  # the resampler holds ~11 ms back
        return
    assert decoded(first, name)[0] > 0
    output = AudioOutput(spec(name, rate, channels))
    first, second = output.push(noise(1)), output.push(noise(2, seed=1))
    if name not in ("mp3", "aac"):
        assert decoded(first, name)[0] > 0
    assert decoded(first + second, name)[0] > 0


def test_opus_pages_leave_at_once_and_aac_is_adts():
    output = AudioOutput(spec("opus"))
    pieces = [output.push(piece) for piece in chunks_of(noise(8), [2 * SPF] * 4)]
    assert pieces[0][:4] == b"OggS" and all(pieces)  # FFmpeg's default 1 s page would hold 3 of 4 back
    assert AudioOutput(spec("aac", 48000, 2)).push(noise(2))[:2] in (b"\xff\xf1", b"\xff\xf9")  # ADTS sync word


def test_spec_headers_describe_the_response():
    assert spec("pcm").headers() == {"X-Sample-Rate": "24000", "X-Channels": "1", "X-Sample-Format": "s16le"}
    assert spec("mp3", 48000, 2).headers() == {"X-Sample-Rate": "48000", "X-Channels": "2"}
    assert spec("wav").samples_per_frame == 1920 and spec("wav", 22050).samples_per_frame == 1764


# --- closing while a worker thread encodes -----------------------------------------------------------

class BlockingEncoder:
    """Holds `encode` until released; records close()."""

    def __init__(self):
        self.entered, self.release, self.closed = threading.Event(), threading.Event(), False

    def encode(self, samples):
        self.entered.set()
        assert self.release.wait(10)
        assert not self.closed, "closed under a running encode"
        return b"x"

    def finish(self):
        return b""

    def close(self):
        self.closed = True


def test_close_never_frees_the_encoder_under_a_running_push(monkeypatch):
    encoder = BlockingEncoder()
    monkeypatch.setattr(audio_output, "open_encoder", lambda spec, whole=False: encoder)
    output = AudioOutput(spec("mp3"))
    worker = threading.Thread(target=output.push, args=(noise(1),))
    worker.start()
    assert encoder.entered.wait(10)
    output.close()  # returns at once: the push still runs
    assert not encoder.closed
    encoder.release.set()
    worker.join(10)
    assert encoder.closed  # the push closed it on its way out
    output.close()  # twice is fine


# --- the app: first bytes after one chunk, with no second chunk in sight ----------------------------

@pytest.mark.parametrize("name", ["pcm", "wav", "flac", "mp3", "opus", "aac"])
@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_the_first_chunk_leaves_before_a_second_exists(name, stream_format):
    """The fake server sends one 2-frame chunk and then nothing (it hangs): the client already has
    that chunk's audio, decodable, in every format, over chunked audio and over SSE."""
    import base64
    import json

    import httpx

    from test_openai_shim_units import FakeStream, fake_shim

    triton, shim = fake_shim(FakeStream([noise(2)], then="hang"))
    with shim as url, httpx.stream("POST", f"{url}/v1/audio/speech", timeout=30, json={
            "input": "Hi.", "response_format": name, "stream_format": stream_format}) as response:
        assert response.status_code == 200
        received = b""
        # kept referenced: a dropped generator closes the response
        pieces = response.iter_bytes() if stream_format == "audio" else (
            base64.b64decode(json.loads(line[6:])["audio"]) for line in response.iter_lines() if line.startswith("data: "))
        for data in pieces:
            received += data
            if decodable(received, name):
                break
        assert decodable(received, name) > 0
        assert not triton.stream.closed.is_set()  # still waiting for the server's second chunk


def test_without_pyav_the_shim_serves_pcm_and_wav_and_says_why_not_the_rest():
    """A shim whose Python lacks PyAV (the H200 device pack cannot carry its 36 MB wheel) still
    imports, serves pcm and wav, and answers an FFmpeg format with a 400 that says why."""
    import subprocess
    import sys

    from conftest import ROOT

    code = """
import sys
sys.modules["av"] = None  # `import av` raises ImportError, as where PyAV is not installed
from client.openai_shim import audio_format, app
from client.openai_shim.schema import SpeechRequest
from pydantic import ValidationError
print(sorted(audio_format.FORMATS), sorted(audio_format.UNSUPPORTED))
try:
    SpeechRequest(input="hi", response_format="mp3")
except ValidationError as exc:
    print(exc.errors()[0]["msg"])
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": f"{ROOT}:{ROOT / 'python_backends'}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    formats, refusal = out.stdout.splitlines()[0], out.stdout.splitlines()[1]
    assert formats == "['pcm', 'wav'] ['aac', 'flac', 'mp3', 'opus']"
    assert "'mp3' has no encoder here; supported: wav, pcm" in refusal
