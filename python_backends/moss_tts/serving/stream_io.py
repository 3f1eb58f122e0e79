"""The Triton side of one `moss_tts` stream: the responses it sends (TritonClient), its children
(TritonChildren: the engine's code chunks in this process, and a vocoder sequence, in this process
or the `vocoder` model over BLS) and ref_encoder over BLS. The stream's policy is SpeechStream's
(pipeline/speech_stream.py); this only converts. BLS calls here are never decoupled: in 24.10 those
corrupt the stub's heap and deadlock it under concurrency (docs/structure.md). Importable only
inside Triton's Python backend stub.
"""

from __future__ import annotations

import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from ..contract.errors import ChildError
from ..pipeline.engine_codes import EngineCodes
from ..pipeline.segmented_codes import SegmentedCodes
from ..pipeline.speech_stream import END_WAIT_S
from ..pipeline.stream_ports import NO_CODES, Ready, new_sequence_id
from ..sessions.session_request import NO_AUDIO
from ..vocoder import internal_key
from ..vocoder.worker import VocoderWorker
from . import triton_io as io
from .stall_watch import StallWatch

log = logging.getLogger(__name__)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
START, END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


def _call(request, output: str, watch: StallWatch, model: str) -> np.ndarray:
    """One non-decoupled BLS call to `model`, watched for stalls: its `output`, or ChildError."""
    with watch.working(f"a BLS call to {model}"):
        response = request.exec()
    if response.has_error():
        raise ChildError.from_message(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, output).as_numpy()


def encode_reference(audio: bytes, watch: StallWatch) -> np.ndarray:
    """Reference file bytes -> codes [1, frames, 12], by ref_encoder over BLS (cached there)."""
    request = pb_utils.InferenceRequest(
        model_name="ref_encoder", inputs=[io.bytes_tensor("REFERENCE_AUDIO", [audio], [1, 1])],
        requested_output_names=["REFERENCE_CODES"])
    return _call(request, "REFERENCE_CODES", watch, "ref_encoder").copy()


def vocode_call(worker, parameters, watch: StallWatch, sequence_id: int, codes, start: bool, end: bool,
                on_done=lambda: None, deadline=None, is_stopping=lambda: False):
    """One call of a vocoder sequence: a job of this process's worker (its audio to come), or a
    call of the `vocoder` model over BLS with the pipeline's key `parameters` (answered: Ready)."""
    if worker is not None:
        return worker.submit(sequence_id, codes, start, end, on_done=on_done, deadline=deadline)
    if end and not start and not len(codes) and is_stopping():
        # The server stops: Triton refuses the END anyway (the vocoder's sequences end with it), and
        # a BLS call made after this instance's last final response can land as Triton finalizes
        # the instance, which crashes tritonserver 2.51 (serving/stop_watch.py).
        return Ready(NO_AUDIO)
    flags = (START if start else 0) | (END if end else 0)
    request = pb_utils.InferenceRequest(
        model_name="vocoder", correlation_id=sequence_id, flags=flags, parameters=parameters,
        inputs=[pb_utils.Tensor("CODES", np.ascontiguousarray(codes, dtype=np.int32)[None])],
        requested_output_names=["AUDIO"])
    return Ready(_call(request, "AUDIO", watch, "vocoder")[0])


def end_sequence(worker, key: str, watch: StallWatch, sequence_id: int, is_stopping) -> None:
    """End a text session's vocoder sequence (closed by SESSION_END, cancel, failure or timeout)."""
    try:
        vocode_call(worker, internal_key.parameters(key), watch, sequence_id, NO_CODES, start=False, end=True,
                    is_stopping=is_stopping).result(timeout=END_WAIT_S)
    except Exception as exc:  # the vocoder's own idle timeout reclaims the sequence
        log.warning("ending text session sequence %x failed: %s", sequence_id, exc)


def refuse(sender, message: str, kind, watch: StallWatch) -> None:
    """A request's one final response, an error, sent from execute(). Watched like every stream's
    send: one that never returns (2.51's gRPC stream handler can deadlock a response callback
    against a client's cancel, docs/structure.md) would hold execute(), so no request would reach
    the model again, and unwatched the heartbeat would beat on through it."""
    with watch.working("a refusal send (execute)"):
        sender.send(io.error_response(message, kind), flags=FINAL)


class TritonChildren:
    """One stream's engine chunks and its vocoder sequence: in this process (`worker`), or the
    `vocoder` model over BLS with the pipeline's key (so it never meets the direct callers'
    quota). Every blocking BLS call is watched for stalls."""

    def __init__(self, codes: "EngineCodes | SegmentedCodes", key: str, watch: StallWatch,
                 worker: "VocoderWorker | None", is_stopping=lambda: False):
        self.codes = codes
        self.is_stopping = is_stopping
        self.parameters = internal_key.parameters(key)
        self.watch = watch
        self.worker = worker
        self.sequence_id = new_sequence_id()

    def stream_codes(self):
        return self.codes.chunks()

    def abort_codes(self):
        self.codes.abort()

    def forward_chunks(self, forward):
        """Let the engine's thread hand this stream's chunks to the in-process vocoder (chunk_forwarder.py):
        one engine request's chunks only (not a long text's segments), and never over BLS. Returns the
        stream's wake (its audio is ready), or None when its chunks cannot be forwarded."""
        if self.worker is None or not isinstance(self.codes, EngineCodes):
            return None
        self.codes.forward = forward
        return self.codes.wake

    def vocode(self, codes, start, end, deadline=None):
        # The job's completion wakes this stream's wait for its next engine chunk.
        return vocode_call(self.worker, self.parameters, self.watch, self.sequence_id, codes, start, end,
                           on_done=self.codes.wake, deadline=deadline, is_stopping=self.is_stopping)


class TritonClient:
    """Sends exactly the outputs the client requested (the 24.10 stub prunes the others after
    releasing the GIL, freeing numpy arrays off the GIL)."""

    def __init__(self, sender, requested: set, watch: StallWatch):
        self.sender = sender
        self.requested = requested
        self.watch = watch

    def send(self, audio, codes, context, final):
        values = {"AUDIO": audio, "CODES": codes, "CONTEXT_CODES": context}
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in values.items()
                   if name in self.requested and value is not None]
        self._send(pb_utils.InferenceResponse(tensors), FINAL if final else 0)

    def send_error(self, message, kind):
        self._send(io.error_response(message, kind), FINAL)

    def send_final(self):
        self._send(None, FINAL)

    def _send(self, response, flags):
        with self.watch.working("a final response send" if flags & FINAL else "a response send"):
            if response is None:
                self.sender.send(flags=flags)
            else:
                self.sender.send(response, flags=flags)

    def is_cancelled(self):
        return self.sender.is_cancelled()
