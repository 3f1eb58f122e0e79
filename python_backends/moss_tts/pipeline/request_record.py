"""What one `moss_tts` request did, for the operator's metrics: outcome, time to first audio,
duration, audio seconds. No Triton import.

`RecordingClient` wraps the stream's `pipeline/speech_stream.Client`: it sees every response on its
way out (the chunk's code rows give the audio length), and on the final one hands a
`RequestRecord` to `on_end` (the adapter observes its Prometheus histograms there, once per
request, off the engine's path).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..contract.errors import ErrorKind
from ..contract.tensors import FRAME_RATE
from .first_audio_trace import FirstAudioTrace, TraceLog

log = logging.getLogger(__name__)
# Histogram buckets (seconds / ratio), also written in README and the Grafana dashboard.
TTFA_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
# "busy": refused at once because max_streams are running (the adapter counts it; no stream ran).
OUTCOMES = ("ok", "cancelled", "invalid", "unavailable", "internal", "busy")
_KIND_OUTCOME = {ErrorKind.CANCELLED: "cancelled", ErrorKind.INVALID_ARGUMENT: "invalid",
                 ErrorKind.UNAVAILABLE: "unavailable", ErrorKind.INTERNAL: "internal"}


@dataclass(frozen=True)
class RequestRecord:
    outcome: str  # one of OUTCOMES
    first_output_s: Optional[float]  # request start -> first response with audio or codes
    duration_s: float  # request start -> final response
    audio_s: float  # audio (or codes) sent, in seconds at 12.5 frames/s

    @property
    def rtf(self) -> Optional[float]:
        """Wall time per second of audio (below 1: faster than real time)."""
        return self.duration_s / self.audio_s if self.audio_s > 0 else None


class RecordingClient:
    def __init__(self, client, on_end: Callable[[RequestRecord], None], started: Optional[float] = None,
                 clock: Callable[[], float] = time.monotonic, trace_log: Optional[TraceLog] = None,
                 session_index: Optional[int] = None) -> None:
        self.client = client
        self.on_end = on_end
        self.clock = clock
        self.started = clock() if started is None else started
        self._first: Optional[float] = None
        self._frames = 0
        self.trace_log = trace_log
        # Its moments to first audio (first_audio_trace.py), when the trace is on.
        self.trace = None if trace_log is None else FirstAudioTrace(self.started, session_index)

    def send(self, audio, codes: np.ndarray, context, final: bool) -> None:
        frames = int(codes.shape[0]) if codes is not None else 0
        if frames and self._first is None:
            self._first = self.clock() - self.started
        self._frames += frames
        self.client.send(audio, codes, context, final)
        if self.trace is not None and audio is not None and frames:
            self.trace.mark("sent")
        if final:
            self._end("ok")

    def send_error(self, message: str, kind: ErrorKind) -> None:
        self.client.send_error(message, kind)
        self._end(_KIND_OUTCOME.get(kind, "internal"))

    def send_final(self) -> None:
        self.client.send_final()
        self._end("ok")

    def is_cancelled(self) -> bool:
        return self.client.is_cancelled()

    def _end(self, outcome: str) -> None:
        record = RequestRecord(outcome, self._first, self.clock() - self.started, self._frames / FRAME_RATE)
        try:
            self.on_end(record)
            if self.trace is not None:
                self.trace_log.write(self.trace, outcome)
        except Exception:  # metrics must never cost a request its (already sent) final response
            log.exception("recording a request's metrics failed")
