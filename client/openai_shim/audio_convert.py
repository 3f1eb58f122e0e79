"""The server's 48 kHz stereo chunks -> a response's rate and channels, while streaming.

One `StreamConverter` per response: the downmix is per sample, and soxr's `ResampleStream` keeps
its filter state from chunk to chunk, so the chunks of an utterance come out as one signal, with
no click at their borders. Streamed and whole conversions are bit-identical: soxr's streaming
output equals `soxr.resample` of the whole input (tests/test_openai_shim_audio.py asserts equality
within 1e-6, the tolerance this module promises; measured: 0). The resampler holds back a few
milliseconds of each chunk (its filter delay, ~11 ms at 24 kHz); `finish()` returns them.
"""

from __future__ import annotations

import numpy as np
import soxr

from .audio_format import CHANNELS, SAMPLE_RATE

# soxr's "HQ": 20-bit precision, more than the 16 bits a response carries, and a shorter delay
# than "VHQ" (28-bit).
QUALITY = "HQ"


def downmix(audio: np.ndarray, channels: int) -> np.ndarray:
    """[2, n] float32 -> [n, channels] float32, C-ordered (interleaved). Mono is the mean of L and
    R: it cannot clip, and a centred voice keeps its level."""
    assert audio.ndim == 2 and audio.shape[0] == CHANNELS, audio.shape
    if channels == CHANNELS:
        # Two strided row copies: half the time of a transposed copy (ascontiguousarray of audio.T).
        interleaved = np.empty((audio.shape[1], CHANNELS), np.float32)
        interleaved[:, 0], interleaved[:, 1] = audio[0], audio[1]
        return interleaved
    mono = np.add(audio[0], audio[1], dtype=np.float32)  # then halved in place: one allocation
    mono *= 0.5
    return mono.reshape(-1, 1)


class StreamConverter:
    """Chunks of one utterance, [2, n] float32 at 48 kHz, -> [m, channels] float32 at `sample_rate`."""

    def __init__(self, sample_rate: int, channels: int):
        self.sample_rate, self.channels = sample_rate, channels
        self._resampler = None
        if sample_rate != SAMPLE_RATE:
            self._resampler = soxr.ResampleStream(SAMPLE_RATE, sample_rate, channels, dtype="float32",
                                                  quality=QUALITY)
        self._is_finished = False

    def push(self, audio: np.ndarray) -> np.ndarray:
        """The converted samples this chunk completes (fewer than its share while the filter fills)."""
        assert not self._is_finished, "push after finish"
        mixed = downmix(audio, self.channels)
        if self._resampler is None:
            return mixed
        return self._resampler.resample_chunk(mixed, last=False)

    def finish(self) -> np.ndarray:
        """The samples still held by the filter; the stream's total length is then exact."""
        self._is_finished = True
        if self._resampler is None:
            return np.zeros((0, self.channels), np.float32)
        return self._resampler.resample_chunk(np.zeros((0, self.channels), np.float32), last=True)


def convert_whole(audio: np.ndarray, sample_rate: int, channels: int) -> np.ndarray:
    """A whole utterance at once: the same samples as its chunks through a StreamConverter."""
    converter = StreamConverter(sample_rate, channels)
    return np.concatenate([converter.push(audio), converter.finish()])
