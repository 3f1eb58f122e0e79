"""moss_tts (BLS entry): TEXT [+ REFERENCE_AUDIO, ...] -> AUDIO [2, samples] float32, 48 kHz.

execute() validates every request (INVALID_ARG at once for bad input), then runs the stream
(speech_pipeline.SpeechStream): ref_encoder, tts_engine and vocoder over BLS with CPU tensors,
audio sent as it is decoded, one final response. One stream per instance at a time.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from moss_tts.serving import triton_io as io
from moss_tts.serving.speech_pipeline import ChildError, CodesChunk, SpeechStream, new_sequence_id
from moss_tts.serving.synthesis_request import RequestError, parse_synthesis_request

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
START, END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
# Inputs passed through to the ensemble unchanged when the client sent them.
PASSTHROUGH = ("REFERENCE_TEXT", "MODE", "LANGUAGE", "INSTRUCTIONS", "TOKENS", "TEMPERATURE", "TOP_P", "TOP_K",
               "REPETITION_PENALTY", "STOP_TEMPERATURE", "STOP_TOP_P", "STOP_TOP_K", "SEED", "MAX_FRAMES",
               "IGNORE_STOP", "FIRST_CHUNK_FRAMES", "CHUNK_FRAMES")


def _child_error(response) -> ChildError:
    err = response.error()
    return ChildError(err.message(), io.error_kind(err))


class TritonChildren:
    """BLS calls of one stream: ref_encoder, the engine (and its ABORT), the vocoder sequence.

    The engine is called directly, not through the moss_tts_codes ensemble (which runs the same
    two models): after a client cancel, 24.10 never hands the ensemble child's final response
    to a BLS iterator, which left a thread blocked and an in-flight request behind.
    """

    def __init__(self, inputs, reference_audio: bytes, request_id: str):
        self.inputs = inputs
        self.reference_audio = reference_audio
        self.request_id = request_id
        self.sequence_id = new_sequence_id()

    def _reference_codes(self):
        request = pb_utils.InferenceRequest(
            model_name="ref_encoder", inputs=[io.bytes_tensor("REFERENCE_AUDIO", [self.reference_audio], [1, 1])],
            requested_output_names=["REFERENCE_CODES"])
        response = request.exec()
        if response.has_error():
            raise _child_error(response)
        return pb_utils.get_output_tensor_by_name(response, "REFERENCE_CODES").as_numpy()

    def stream_codes(self):
        inputs = list(self.inputs)
        if self.reference_audio:
            inputs.append(pb_utils.Tensor("REFERENCE_CODES", self._reference_codes()))
        request = pb_utils.InferenceRequest(model_name="tts_engine", inputs=inputs,
                                            requested_output_names=["CODES", "CONTEXT_CODES"])
        for response in request.exec(decoupled=True):
            if response.has_error():
                raise _child_error(response)
            codes = pb_utils.get_output_tensor_by_name(response, "CODES")
            if codes is None:
                continue  # the empty final response
            context = pb_utils.get_output_tensor_by_name(response, "CONTEXT_CODES")
            yield CodesChunk(codes.as_numpy(), context.as_numpy())

    def abort_codes(self):
        inputs = [io.bytes_tensor("TEXT", [b"-"], [1]), io.bytes_tensor("REQUEST_ID", [self.request_id.encode()], [1]),
                  pb_utils.Tensor("ABORT", np.array([True]))]
        for _ in pb_utils.InferenceRequest(model_name="tts_engine", inputs=inputs,
                                           requested_output_names=["CODES"]).exec(decoupled=True):
            pass

    def vocode(self, codes, start, end):
        flags = (START if start else 0) | (END if end else 0)
        request = pb_utils.InferenceRequest(
            model_name="vocoder", correlation_id=self.sequence_id, flags=flags,
            inputs=[pb_utils.Tensor("CODES", np.ascontiguousarray(codes, dtype=np.int32)[None])],
            requested_output_names=["AUDIO"])
        response = request.exec()
        if response.has_error():
            raise _child_error(response)
        return pb_utils.get_output_tensor_by_name(response, "AUDIO").as_numpy()[0]


class TritonClient:
    def __init__(self, sender):
        self.sender = sender

    def send_audio(self, audio, final):
        response = pb_utils.InferenceResponse([pb_utils.Tensor("AUDIO", np.ascontiguousarray(audio, np.float32))])
        self.sender.send(response, flags=FINAL if final else 0)

    def send_error(self, message, code):
        self.sender.send(io.error_response(message, code), flags=FINAL)

    def send_final(self):
        self.sender.send(flags=FINAL)

    def is_cancelled(self):
        return self.sender.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        io.require_decoupled(io.model_config(args))

    def execute(self, requests):
        # Each stream runs to its end inside execute, on Triton's thread: BLS calls made from
        # threads of our own corrupted the 24.10 stub's heap under load. Concurrency comes from
        # the instance count in config.pbtxt.
        for request in requests:
            sender = request.get_response_sender()
            try:
                stream = self._prepare(request, sender)
            except RequestError as exc:
                sender.send(io.error_response(str(exc)), flags=FINAL)
                continue
            stream.run()
        return None

    def _prepare(self, request, sender):
        get = io.getter(request)
        synthesis = parse_synthesis_request(get, request.request_id() or "")
        request_id = f"{synthesis.request_id or 'req'}-{new_sequence_id():x}"  # unique per stream
        audio = get("REFERENCE_AUDIO")
        audio = b"" if audio is None else bytes(audio.reshape(-1)[0])
        if synthesis.mode == "continuation" and not audio:
            raise RequestError("MODE=continuation needs REFERENCE_AUDIO (the audio to continue)")
        inputs = [io.bytes_tensor("TEXT", [get("TEXT").reshape(-1)[0]], [1]),
                  io.bytes_tensor("REQUEST_ID", [request_id.encode()], [1])]
        inputs += [pb_utils.Tensor(name, get(name).reshape(1)) for name in PASSTHROUGH if get(name) is not None]
        return SpeechStream(TritonChildren(inputs, audio, request_id), TritonClient(sender), synthesis.stream)

