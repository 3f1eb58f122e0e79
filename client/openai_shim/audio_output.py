"""One response's audio: the server's chunks (48 kHz stereo float32) in, the response's bytes out.

`AudioOutput` = a StreamConverter (rate, channels) + an encoder (format), for one utterance or one
WebSocket session. Each `push` returns the bytes that chunk completes, at once (the first push
also carries the container's header), so a response's first bytes leave with the server's first
chunk whatever the format; `finish()` returns what the resampler and the codec still hold.
`push` and `finish` may run on worker threads; `close()` (a client gone) never waits for them and
never frees the encoder under a running call: FFmpeg would read freed memory.
"""

from __future__ import annotations

import threading

import numpy as np

from .audio_convert import StreamConverter
from .audio_encode import open_encoder
from .audio_format import CHANNELS, SAMPLES_PER_FRAME, OutputSpec

NO_AUDIO = np.zeros((CHANNELS, 0), np.float32)


class AudioOutput:
    def __init__(self, spec: OutputSpec, whole: bool = False):
        self.spec = spec
        self._converter = StreamConverter(spec.sample_rate, spec.channels)
        self._encoder = open_encoder(spec, whole)
        self.num_samples = 0  # per channel at 48 kHz, as received from the server
        self._busy = threading.Lock()  # held by push/finish while the encoder works
        self._is_closing = False

    def push(self, audio: np.ndarray) -> bytes:
        """[2, n] float32 at 48 kHz -> the bytes it completes (possibly none)."""
        with self._busy:
            assert not self._is_closing, "push after close"
            self.num_samples += audio.shape[1]
            data = self._encoder.encode(self._converter.push(audio))
        self._close_if_asked()
        return data

    def finish(self) -> bytes:
        """The rest: the resampler's tail, the codec's look-ahead, the container's trailer."""
        with self._busy:
            assert not self._is_closing, "finish after close"
            data = self._encoder.encode(self._converter.finish()) + self._encoder.finish()
        self.close()
        return data

    def close(self) -> None:
        """Free the encoder (a response that ended early; safe twice, safe after finish) now, or, if a
        push is running on another thread, as soon as it returns."""
        self._is_closing = True
        self._close_if_asked()

    def _close_if_asked(self) -> None:
        # Runs after every call releases the lock and after close() raises the flag: whichever of a
        # running push and close() comes second finds the lock free and the flag up.
        if self._is_closing and self._busy.acquire(blocking=False):
            try:
                self._encoder.close()
            finally:
                self._busy.release()

    @property
    def is_light(self) -> bool:
        """pcm and wav: ~0.5 ms of numpy per second of audio, less than a worker thread's round trip
        costs the event loop (two hand-offs of the GIL); the FFmpeg formats (3-9% of a core per
        second of audio, README "Audio") go to a worker thread."""
        return self.spec.format.codec is None

    @property
    def num_frames(self) -> int:
        """The server's 80 ms frames received so far."""
        return self.num_samples // SAMPLES_PER_FRAME


def encode_whole(audio: np.ndarray, spec: OutputSpec) -> bytes:
    """A whole utterance ([2, n] float32 at 48 kHz) as one response body."""
    output = AudioOutput(spec, whole=True)
    try:
        return output.push(audio) + output.finish()
    finally:
        output.close()  # after an error
