"""float32 audio [2, samples] at 48 kHz -> the bytes of a response format.

Whole responses: pcm (raw s16le, interleaved stereo), wav (16-bit PCM), flac (16-bit), mp3, opus
(Ogg Opus) through soundfile, when the local libsndfile can write them (`FORMATS`).
Streams (pcm, wav): each Triton chunk becomes its s16le bytes at once; a streamed wav starts with
a 44-byte header whose sizes are 0xFFFFFFFF ("unknown length"), which soundfile, ffmpeg and
browsers read to the end of the data.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Optional

import numpy as np
import soundfile as sf

SAMPLE_RATE = 48000  # Hz, the MOSS-Audio-Tokenizer-v2 output rate
CHANNELS = 2
SAMPLES_PER_FRAME = 3840  # per channel: one 80 ms codec frame
BYTES_PER_SAMPLE = 2  # s16le
UNKNOWN_SIZE = 0xFFFFFFFF


@dataclass(frozen=True)
class AudioFormat:
    name: str
    media_type: str
    sf_format: Optional[str]  # None: raw pcm, written by hand
    sf_subtype: Optional[str]
    sample_format: Optional[str]  # X-Sample-Format; None for lossy codecs

    @property
    def can_stream(self) -> bool:
        return self.name in ("pcm", "wav")

    def headers(self) -> dict[str, str]:
        headers = {"X-Sample-Rate": str(SAMPLE_RATE), "X-Channels": str(CHANNELS)}
        if self.sample_format:
            headers["X-Sample-Format"] = self.sample_format
        return headers


_CANDIDATES = (
    AudioFormat("wav", "audio/wav", "WAV", "PCM_16", "s16le"),
    AudioFormat("pcm", "audio/pcm", None, None, "s16le"),
    AudioFormat("flac", "audio/flac", "FLAC", "PCM_16", "s16"),
    AudioFormat("mp3", "audio/mpeg", "MP3", "MPEG_LAYER_III", None),
    AudioFormat("opus", "audio/ogg", "OGG", "OPUS", None),
)
# OpenAI names this server cannot produce (libsndfile has no AAC encoder).
UNSUPPORTED = ("aac",)


def _writable(fmt: AudioFormat) -> bool:
    if fmt.sf_format is None:
        return True
    try:
        return fmt.sf_subtype in sf.available_subtypes(fmt.sf_format)
    except Exception:  # libsndfile without this container
        return False


FORMATS: dict[str, AudioFormat] = {fmt.name: fmt for fmt in _CANDIDATES if _writable(fmt)}


def to_pcm16(audio: np.ndarray) -> bytes:
    """[2, n] float32 in [-1, 1] -> interleaved s16le bytes (clipped, rounded)."""
    assert audio.ndim == 2 and audio.shape[0] == CHANNELS, audio.shape
    scaled = np.rint(np.clip(audio.T, -1.0, 1.0) * 32767.0)
    return scaled.astype("<i2").tobytes()


def wav_stream_header() -> bytes:
    block_align = CHANNELS * BYTES_PER_SAMPLE
    return (b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, CHANNELS, SAMPLE_RATE, SAMPLE_RATE * block_align,
                                    block_align, 8 * BYTES_PER_SAMPLE)
            + b"data" + struct.pack("<I", UNKNOWN_SIZE))


def encode(audio: np.ndarray, fmt: AudioFormat) -> bytes:
    """A whole utterance in one response."""
    if fmt.sf_format is None:
        return to_pcm16(audio)
    buffer = io.BytesIO()
    sf.write(buffer, np.ascontiguousarray(audio.T), SAMPLE_RATE, format=fmt.sf_format, subtype=fmt.sf_subtype)
    return buffer.getvalue()


class StreamEncoder:
    """Chunks of one streamed utterance -> bytes; the first call also carries the wav header."""

    def __init__(self, fmt: AudioFormat):
        assert fmt.can_stream, fmt.name
        self.fmt = fmt
        self.num_samples = 0  # per channel, so far
        self._started = False

    def encode(self, audio: np.ndarray) -> bytes:
        header = b""
        if not self._started:
            self._started = True
            header = wav_stream_header() if self.fmt.name == "wav" else b""
        self.num_samples += audio.shape[1]
        return header + to_pcm16(audio)

    @property
    def num_frames(self) -> int:
        return self.num_samples // SAMPLES_PER_FRAME
