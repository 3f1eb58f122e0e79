"""A fake `moss_tts` for benchmarks of what stands in front of the server (perf/bench_shim.py):
the same inputs, checked by the same parsers, the same responses (AUDIO [2, samples] of silence,
CODES [frames, 12] of zeros when asked, then an empty final response), at a set pace, with no
model. perf/fake_tts_server.py builds its repository from the real config.pbtxt, so it accepts
exactly what `moss_tts` accepts.

Pace (pbtxt parameters): a stream's chunk k is sent `first_chunk_ms` + (frames up to and including
chunk k) / `frames_per_s` after the request arrived (a session's request starts when its previous
one ended), in the real chunk schedule (`first_chunk_frames`, then growing by what was sent, up to
`chunk_frames`: the engine's own chunk_target, with the real config's values). Length: MAX_FRAMES with
IGNORE_STOP, else `frames_per_char` per character of TEXT (at most MAX_FRAMES). One thread sends
every stream's chunks, in time order, from a heap; a cancelled stream ends at its next chunk.
"""

import heapq
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from moss_tts.contract.errors import ErrorKind, ServingError
from moss_tts.contract.tensors import N_VQ, SAMPLES_PER_FRAME
from moss_tts.engine.request import chunk_target
from moss_tts.serving import triton_io as io
from moss_tts.pipeline.synthesis_request import parse_session_inputs, parse_synthesis_request

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def chunk_sizes(frames: int, first_chunk_frames: int, chunk_frames: int) -> list[int]:
    """The frames of each chunk, as the engine cuts them."""
    sizes, sent = [], 0
    while sent < frames:
        sizes.append(min(chunk_target(sent, first_chunk_frames, chunk_frames), frames - sent))
        sent += sizes[-1]
    return sizes


class Stream:
    """One request's responses: (due time, frames) per chunk; the final after the last."""

    def __init__(self, sender, requested: set, start: float, sizes: list[int], frames_per_s: float, stream: bool,
                 session_id=None):
        self.sender, self.requested, self.stream, self.session_id = sender, requested, stream, session_id
        self.dues, at = [], start
        for size in sizes:
            at += size / frames_per_s
            self.dues.append((at, size))
        self.end = at

    def due(self) -> float:
        return self.dues[0][0] if self.dues else self.end


class TritonPythonModel:
    def initialize(self, args):
        config, params = io.model_config(args), io.model_parameters(args)
        io.require_decoupled(config)
        io.prepare_stub()
        self.first_chunk_frames = int(params["first_chunk_frames"])
        self.chunk_frames = int(params["chunk_frames"])
        self.frames_per_s = float(params["frames_per_s"])
        self.first_chunk_s = float(params["first_chunk_ms"]) / 1000
        self.frames_per_char = float(params["frames_per_char"])
        self.sessions: dict[str, float] = {}  # session id -> when its last request ends
        self.heap: list = []
        self.seq = 0
        self.cond = threading.Condition()
        self.silence: dict[int, np.ndarray] = {}
        self.stopping = False
        self.thread = threading.Thread(target=self._send_loop, name="fake-tts-sender", daemon=True)
        self.thread.start()

    def execute(self, requests):
        now = time.monotonic()
        for request in requests:
            sender = request.get_response_sender()
            try:
                with self.cond:  # the sessions' end times are the sender thread's too
                    self._push(self._stream(request, sender, now))
            except ServingError as exc:
                sender.send(io.error_response(str(exc), exc.kind), flags=FINAL)
        return None

    def _stream(self, request, sender, now: float) -> Stream:
        get = io.getter(request)
        session = parse_session_inputs(get)
        requested = set(request.requested_output_names()) or {"AUDIO", "CODES"}
        frames = 0
        synthesis = None
        if session is None or session.has_text:
            synthesis = parse_synthesis_request(get, "")
            params = synthesis.params
            by_text = max(1, round(len(synthesis.text) * self.frames_per_char))
            frames = params.max_frames if params.ignore_stop else min(params.max_frames, by_text)
        start = now
        if session is not None:  # in order: after the session's previous request
            start = max(now, self.sessions.get(session.session_id, now))
        first = (synthesis and synthesis.first_chunk_frames) or self.first_chunk_frames
        chunk = (synthesis and synthesis.chunk_frames) or self.chunk_frames
        sizes = chunk_sizes(frames, first, chunk) if synthesis is None or synthesis.stream else [frames]
        stream = Stream(sender, requested, start + (self.first_chunk_s if frames else 0.0), sizes,
                        self.frames_per_s, synthesis is None or synthesis.stream, session and session.session_id)
        if session is not None:
            if session.is_end:
                self.sessions.pop(session.session_id, None)
            else:
                self.sessions[session.session_id] = stream.end
        return stream

    def _push(self, stream: Stream) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (stream.due(), self.seq, stream))
        self.cond.notify()

    def _send_loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and (not self.heap or self.heap[0][0] > time.monotonic()):
                    self.cond.wait(None if not self.heap else self.heap[0][0] - time.monotonic())
                if self.stopping:
                    return
                _, _, stream = heapq.heappop(self.heap)
            if self._send_next(stream):
                with self.cond:
                    self._push(stream)

    def _send_next(self, stream: Stream) -> bool:
        """Send the stream's next chunk (or its final); True while more is to come."""
        if not stream.dues or stream.sender.is_cancelled():
            if stream.dues and stream.session_id is not None:  # a cancelled session: no later request comes
                with self.cond:
                    self.sessions.pop(stream.session_id, None)
            stream.sender.send(flags=FINAL)
            return False
        _, frames = stream.dues.pop(0)
        flags = FINAL if not stream.stream else 0
        stream.sender.send(pb_utils.InferenceResponse(self._tensors(stream.requested, frames)), flags=flags)
        return stream.stream

    def _tensors(self, requested: set, frames: int) -> list:
        if frames not in self.silence:
            self.silence[frames] = np.zeros((2, frames * SAMPLES_PER_FRAME), np.float32)
        tensors = []
        if "AUDIO" in requested:
            tensors.append(pb_utils.Tensor("AUDIO", self.silence[frames]))
        if "CODES" in requested:
            tensors.append(pb_utils.Tensor("CODES", np.zeros((frames, N_VQ), np.int32)))
        return tensors

    def finalize(self):
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout=5)
        for _, _, stream in self.heap:
            stream.sender.send(io.error_response("the server is shutting down", ErrorKind.UNAVAILABLE), flags=FINAL)
