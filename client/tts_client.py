"""A small streaming client for the `moss_tts` entry (and the `moss_tts_codes` ensemble).

One gRPC stream per utterance: responses of one request arrive in order, and cancelling the
stream cancels exactly this utterance on the server (engine rows and vocoder slot are freed).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

SAMPLE_RATE = 48000

# Optional inputs: name -> (numpy dtype, Triton dtype)
OPTIONAL_INPUTS = {
    "REFERENCE_TEXT": (object, "BYTES"), "MODE": (object, "BYTES"), "LANGUAGE": (object, "BYTES"),
    "INSTRUCTIONS": (object, "BYTES"), "TOKENS": (np.int32, "INT32"), "TEMPERATURE": (np.float32, "FP32"),
    "TOP_P": (np.float32, "FP32"), "TOP_K": (np.int32, "INT32"), "REPETITION_PENALTY": (np.float32, "FP32"),
    "SEED": (np.int64, "INT64"), "MAX_FRAMES": (np.int32, "INT32"), "IGNORE_STOP": (bool, "BOOL"),
    "STREAM": (bool, "BOOL"), "FIRST_CHUNK_FRAMES": (np.int32, "INT32"), "CHUNK_FRAMES": (np.int32, "INT32"),
}


def _input(name: str, value, np_dtype, triton_dtype: str, shape=(1,)) -> grpcclient.InferInput:
    if np_dtype is object and isinstance(value, str):
        value = value.encode("utf-8")
    array = np.array([value], dtype=np_dtype).reshape(shape)
    tensor = grpcclient.InferInput(name, list(array.shape), triton_dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def build_inputs(text: str, reference_audio: Optional[bytes] = None, ensemble: bool = False,
                 **options) -> list[grpcclient.InferInput]:
    """Inputs for moss_tts (or the moss_tts_codes ensemble); options use lower-case input names."""
    inputs = [_input("TEXT", text, object, "BYTES")]
    if ensemble:  # the ensemble always takes REFERENCE_AUDIO, shaped [1, 1]; empty = none
        inputs.append(_input("REFERENCE_AUDIO", reference_audio or b"", object, "BYTES", (1, 1)))
    elif reference_audio:
        inputs.append(_input("REFERENCE_AUDIO", reference_audio, object, "BYTES"))
    for key, value in options.items():
        name = key.upper()
        if name not in OPTIONAL_INPUTS:
            raise ValueError(f"unknown option {key!r}; known: {sorted(k.lower() for k in OPTIONAL_INPUTS)}")
        if value is not None:
            inputs.append(_input(name, value, *OPTIONAL_INPUTS[name]))
    return inputs


@dataclass
class Utterance:
    chunks: list[np.ndarray] = field(default_factory=list)  # AUDIO [2, n] or CODES [n, 12]
    first_chunk_seconds: Optional[float] = None
    total_seconds: float = 0.0

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks, axis=1) if self.chunks else np.zeros((2, 0), np.float32)


class TTSClient:
    def __init__(self, url: str = "localhost:8001") -> None:
        self.url = url

    def stream(self, inputs, model: str = "moss_tts", output: str = "AUDIO",
               timeout: float = 600.0) -> Iterator[np.ndarray]:
        """Yield each response's `output` as it arrives; raises InferenceServerException on error.
        Only `output` is requested: ask moss_tts for CODES and the vocoder is never called.
        Closing the generator early cancels the request on the server."""
        events: "queue.Queue" = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        finished = False
        try:
            client.async_stream_infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(output)],
                                      enable_empty_final_response=True)
            while True:
                result, error = events.get(timeout=timeout)
                if error is not None:
                    finished = True
                    raise error
                array = result.as_numpy(output)
                if array is not None and array.size:
                    yield array
                if result.get_response().parameters["triton_final_response"].bool_param:
                    finished = True
                    return
        finally:
            client.stop_stream(cancel_requests=not finished)
            client.close()

    def synthesize(self, inputs, model: str = "moss_tts", output: str = "AUDIO") -> Utterance:
        start = time.perf_counter()
        utterance = Utterance()
        for chunk in self.stream(inputs, model, output):
            if utterance.first_chunk_seconds is None:
                utterance.first_chunk_seconds = time.perf_counter() - start
            utterance.chunks.append(chunk)
        utterance.total_seconds = time.perf_counter() - start
        return utterance


__all__ = ["TTSClient", "Utterance", "build_inputs", "error_code", "InferenceServerException", "SAMPLE_RATE"]


def error_code(exc: InferenceServerException) -> str:
    """The gRPC code name of a server error: moss-tts-triton tags its messages "[CODE] ..."
    because gRPC stream responses carry no status code."""
    message = exc.message() or ""
    if message.startswith("in ensemble '"):
        message = message.split("', ", 1)[-1]
    if message.startswith("[") and "]" in message:
        return message[1:message.index("]")]
    return str(exc.status() or "UNKNOWN")
