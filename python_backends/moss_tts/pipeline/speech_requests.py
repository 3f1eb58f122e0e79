"""SpeechRequests: a `moss_tts` request, read by input name, turned into the SpeechStream that a
stream thread runs. This is the entry's request policy, kept out of the Triton adapter so it is
tested without Triton:
- every input is checked at once (InvalidRequest: the adapter answers INVALID_ARGUMENT);
- the engine's request id is made unique (client ids repeat across clients);
- the reference is a callable the stream thread runs: ref_encoder for REFERENCE_AUDIO, or the
  REFERENCE_CODES the client sent (never both; continuation needs one);
- the codes come from one engine request, or one per segment of a long text (codes_for).
What crosses Triton is the adapter's: `children(codes)` (the stream's engine chunks and its vocoder
sequence) and `encode_reference(audio)`. Text sessions build on this (sessions/admission.py).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..contract.errors import InvalidRequest
from ..contract.tensors import MOSS_TTS_OUTPUTS, N_VQ
from .engine_streams import EngineStreams
from .first_audio_trace import TraceLog
from .request_record import RecordingClient, RequestRecord
from .segmented_codes import SegmentedCodes, codes_for
from .speech_stream import SpeechStream
from .stream_ports import Children, Client, new_sequence_id
from .synthesis_request import Getter, SynthesisRequest, parse_synthesis_request

OUTPUTS = tuple(t.name for t in MOSS_TTS_OUTPUTS)  # what a request that names none gets
Reference = Callable[[], Optional[np.ndarray]]  # the reference codes, fetched on the stream thread


def requested_outputs(names) -> set:
    """The outputs a request asked for (all of them when it named none)."""
    return set(names) or set(OUTPUTS)


class SpeechRequests:
    def __init__(self, streams: EngineStreams, builder, children: Callable[[object], Children],
                 encode_reference: Callable[[bytes], np.ndarray], observe: Callable[[RequestRecord], None],
                 is_stopping: Callable[[], bool], trace_log: Optional[TraceLog] = None,
                 forward_chunks: bool = False) -> None:
        self.streams = streams
        self.builder = builder  # model.processor.PromptBuilder
        self.children = children
        self.encode_reference = encode_reference
        self.observe = observe
        self.is_stopping = is_stopping
        self.trace_log = trace_log  # first_audio_trace.TraceLog, or None (the trace is off)
        self.forward_chunks = forward_chunks  # the engine hands chunks to the vocoder (chunk_forwarder.py)

    def stream(self, get: Getter, request_id: str, requested: set, client: Client,
               started: float) -> tuple[SpeechStream, str]:
        """A request outside any text session: its SpeechStream, and what kind of request it is
        (request_ledger.PATHS: long_form, codes, stream or offline)."""
        synthesis = self.synthesis(request_id, get)
        reference = self.reference(get, synthesis)
        codes = self.codes(synthesis, reference)  # long text: one request per segment
        path = ("long_form" if isinstance(codes, SegmentedCodes) else "codes" if "AUDIO" not in requested
                else "stream" if synthesis.stream else "offline")
        recording = self.record(client, started)
        stream = SpeechStream(self.children(codes), recording, synthesis.stream, "AUDIO" in requested,
                              self.is_stopping, recording.trace, forward_chunks=self.forward_chunks)
        return stream, path

    @staticmethod
    def synthesis(request_id: str, get: Getter) -> SynthesisRequest:
        synthesis = parse_synthesis_request(get, "")
        # Client request ids repeat across clients ("1", ...): the engine id is made unique.
        return synthesis.with_request_id(f"{synthesis.request_id or request_id or 'req'}-{new_sequence_id():x}")

    def reference(self, get: Getter, synthesis: SynthesisRequest) -> Reference:
        """The request's reference codes, as a callable the stream thread runs (ref_encoder over BLS)."""
        # Copies: the stream outlives execute(), and with it the request's input buffers.
        audio = get("REFERENCE_AUDIO")
        audio = b"" if audio is None else bytes(audio.reshape(-1)[0])
        given = get("REFERENCE_CODES")
        given = None if given is None else np.array(given, dtype=np.int32).reshape(-1, N_VQ)
        if audio and given is not None and given.size:
            raise InvalidRequest("send REFERENCE_AUDIO or REFERENCE_CODES, not both")
        if synthesis.mode == "continuation" and not audio and (given is None or not given.size):
            raise InvalidRequest("MODE=continuation needs REFERENCE_AUDIO (or REFERENCE_CODES): the audio to continue")
        return (lambda: self.encode_reference(audio)) if audio else (lambda: given)

    def codes(self, synthesis: SynthesisRequest, reference: Reference):
        """EngineCodes, or SegmentedCodes for a long text."""
        return codes_for(self.streams, self.builder, synthesis, reference)

    def record(self, client: Client, started: float, session_index: Optional[int] = None) -> RecordingClient:
        """`client`, recording what the request did for the operator's metrics (request_record.py)."""
        return RecordingClient(client, self.observe, started, trace_log=self.trace_log, session_index=session_index)
