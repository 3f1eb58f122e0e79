"""Incremental encoders: a response's samples, chunk by chunk, -> the bytes of its format.

Every encoder takes [n, channels] float32 (interleaved) at the response's rate and returns, for each
chunk, the bytes it completes; `finish()` returns the rest. `pcm` and `wav` are written here (a
streamed wav's header reads 0xFFFFFFFF for its sizes, "unknown length", as OpenAI's does). The
others go through PyAV, FFmpeg's encoders and muxers, into a sink that hands over what was
written so far:
- mp3: LAME, CBR 64 kbit/s per channel, no ID3 tag;
- opus: libopus in Ogg, 32 kbit/s per channel, one 20 ms packet per page, so a page leaves as
  soon as its packet is encoded (FFmpeg's default page holds up to 1 s);
- aac: FFmpeg's AAC-LC in ADTS frames, 64 kbit/s per channel;
- flac: 40 ms blocks (FFmpeg's default, 105 ms, held the first 80 ms chunk back) of the very 16-bit
  samples `pcm` carries (FFmpeg's own float conversion rounds differently).
What is still inside a codec at a chunk's end (LAME's and AAC's look-ahead, a partial Opus packet
or FLAC block) leaves with the next chunk or `finish()`. A whole response (`whole=True`) is
written to a seekable buffer instead, so FFmpeg completes the headers at the end: the FLAC
STREAMINFO's length and MD5, the mp3's Xing/LAME frame, the wav's sizes.
"""

from __future__ import annotations

import io
import struct
from fractions import Fraction
from typing import Optional, Protocol

import numpy as np

from .audio_format import OutputSpec, av  # av is None without PyAV: then no FFmpeg format is offered

BYTES_PER_SAMPLE = 2  # s16le
UNKNOWN_SIZE = 0xFFFFFFFF
OGG_PAGE_US = 20_000  # one Opus packet (20 ms) per Ogg page
FLAC_BLOCK_S = 0.04
BIT_RATES = {"mp3": 64_000, "aac": 64_000, "opus": 32_000}  # bit/s per channel
AVIO_BUFFER_BYTES = 4096


class Encoder(Protocol):
    def encode(self, samples: np.ndarray) -> bytes: ...

    def finish(self) -> bytes: ...

    def close(self) -> None: ...


def to_pcm16(samples: np.ndarray) -> bytes:
    """[n, channels] float32 in [-1, 1] -> interleaved s16le bytes (clipped, rounded)."""
    assert samples.ndim == 2, samples.shape
    scaled = np.clip(samples, -1.0, 1.0)
    scaled *= 32767.0
    pcm = np.empty(samples.shape, "<i2")
    np.rint(scaled, out=pcm, casting="unsafe")  # rounded and cast in one pass (the values fit int16)
    return pcm.tobytes()


def wav_header(sample_rate: int, channels: int, data_bytes: int = UNKNOWN_SIZE) -> bytes:
    """The 44-byte header of 16-bit PCM; sizes 0xFFFFFFFF when the length is not known yet."""
    block_align = channels * BYTES_PER_SAMPLE
    riff_size = UNKNOWN_SIZE if data_bytes == UNKNOWN_SIZE else 36 + data_bytes
    return (b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block_align,
                                    block_align, 8 * BYTES_PER_SAMPLE)
            + b"data" + struct.pack("<I", data_bytes))


class PcmEncoder:
    """Raw s16le, or a wav (its header first): nothing is held back."""

    def __init__(self, spec: OutputSpec, whole: bool = False):
        self.spec, self.whole = spec, whole
        self._is_wav = spec.format.name == "wav"
        self._parts: list[bytes] = []  # whole: the data, until finish() knows its size
        self._started = False

    def encode(self, samples: np.ndarray) -> bytes:
        data = to_pcm16(samples)
        if self.whole:
            self._parts.append(data)
            return b""
        if self._is_wav and not self._started:
            data = wav_header(self.spec.sample_rate, self.spec.channels) + data
        self._started = True
        return data

    def finish(self) -> bytes:
        if not self.whole:
            return b""
        data = b"".join(self._parts)
        return wav_header(self.spec.sample_rate, self.spec.channels, len(data)) + data if self._is_wav else data

    def close(self) -> None:
        self._parts.clear()


class _Sink:
    """A write-only file for FFmpeg: not seekable, so the muxers write as they go; `take()` hands
    over what was written since the last call."""

    def __init__(self):
        self._data = bytearray()

    def write(self, data) -> int:
        self._data += data
        return len(data)

    def take(self) -> bytes:
        data = bytes(self._data)
        self._data.clear()
        return data


class AvEncoder:
    """mp3, opus, aac or flac through PyAV."""

    def __init__(self, spec: OutputSpec, whole: bool = False):
        fmt = spec.format
        self.spec, self.whole = spec, whole
        self._sink = io.BytesIO() if whole else _Sink()
        self._layout = "mono" if spec.channels == 1 else "stereo"
        self._is_s16 = fmt.is_lossless
        self._container = av.open(self._sink, mode="w", format=fmt.muxer, buffer_size=AVIO_BUFFER_BYTES,
                                  options=_muxer_options(fmt.name))
        try:
            self._container.flags |= av.container.Flags.flush_packets.value  # write each packet at once
            self._stream = self._container.add_stream(fmt.codec, rate=spec.sample_rate,
                                                      options=_codec_options(spec))
            self._stream.layout = self._layout
            if fmt.name in BIT_RATES:
                self._stream.bit_rate = BIT_RATES[fmt.name] * spec.channels
            self._container.start_encoding()  # the container's header: the first bytes
        except BaseException:
            self._container.close()
            raise
        self._pts = 0
        self._closed = False

    def encode(self, samples: np.ndarray) -> bytes:
        if len(samples):
            if self._is_s16:
                packed, sample_format = np.frombuffer(to_pcm16(samples), "<i2").reshape(1, -1), "s16"
            else:
                packed, sample_format = np.ascontiguousarray(samples, np.float32).reshape(1, -1), "flt"
            frame = av.AudioFrame.from_ndarray(packed, format=sample_format, layout=self._layout)
            frame.sample_rate = self.spec.sample_rate
            frame.time_base = Fraction(1, self.spec.sample_rate)
            frame.pts = self._pts
            self._pts += len(samples)
            self._mux(frame)
        return self._taken()

    def finish(self) -> bytes:
        self._mux(None)  # the codec's look-ahead and last partial packet
        self.close()  # the trailer (for a whole response also the completed headers)
        return self._sink.getvalue() if self.whole else self._sink.take()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._container.close()

    def _mux(self, frame: Optional[av.AudioFrame]) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def _taken(self) -> bytes:
        return b"" if self.whole else self._sink.take()


def _muxer_options(name: str) -> dict[str, str]:
    if name == "mp3":
        return {"id3v2_version": "0"}
    if name == "opus":
        return {"page_duration": str(OGG_PAGE_US)}
    return {}


def _codec_options(spec: OutputSpec) -> dict[str, str]:
    if spec.format.name == "flac":
        return {"frame_size": str(round(spec.sample_rate * FLAC_BLOCK_S))}
    return {}


def open_encoder(spec: OutputSpec, whole: bool = False) -> Encoder:
    """The encoder of `spec`'s format; `whole`: one response at the end instead of a stream."""
    return AvEncoder(spec, whole) if spec.format.codec else PcmEncoder(spec, whole)
