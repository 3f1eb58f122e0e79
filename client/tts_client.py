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

from moss_tts import contract
from moss_tts.contract import SAMPLE_RATE, ErrorKind, classify


def option_input(name: str, value, shape=(1,)) -> grpcclient.InferInput:
    """One moss_tts input, typed as the contract declares it (ValueError for a value its dtype cannot hold)."""
    array = contract.input_array(name, value, shape)
    tensor = grpcclient.InferInput(name, list(array.shape), contract.INPUTS[name].dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def build_inputs(text: str, reference_audio: Optional[bytes] = None, ensemble: bool = False,
                 reference_codes: Optional[np.ndarray] = None, **options) -> list[grpcclient.InferInput]:
    """Inputs for moss_tts (or the moss_tts_codes ensemble); options use lower-case input names
    (top_p=0.9, stop_top_k=20, ...: every shape-[1] input of moss_tts.contract).
    `reference_codes` [frames, 12] (a saved voice, client/voices.py) replaces reference audio."""
    inputs = [option_input("TEXT", text)]
    if reference_codes is not None:
        inputs.append(option_input("REFERENCE_CODES", reference_codes))
    if ensemble:  # the ensemble always takes REFERENCE_AUDIO, shaped [1, 1]; empty = none
        inputs.append(option_input("REFERENCE_AUDIO", reference_audio or b"", (1, 1)))
    elif reference_audio:
        inputs.append(option_input("REFERENCE_AUDIO", reference_audio))
    for key, value in options.items():
        name = key.upper()
        if name not in OPTIONS:
            raise ValueError(f"unknown option {key!r}; known: {sorted(k.lower() for k in OPTIONS)}")
        if value is not None:
            inputs.append(option_input(name, value))
    return inputs


# The options build_inputs takes by keyword: every shape-[1] input but TEXT and REFERENCE_AUDIO.
OPTIONS = [t.name for t in contract.MOSS_TTS_INPUTS if t.dims == (1,) and t.name not in ("TEXT", "REFERENCE_AUDIO")]


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
    """The gRPC code name of a server error (moss_tts.contract.classify): our messages are tagged
    "[CODE] ..." because gRPC stream responses carry no status code, and Triton's own refusals
    (wrong dtype or shape, a missing input, a dead stub) are recognised by their wording."""
    message = exc.message() or ""
    kind, _ = classify(message)
    if kind is ErrorKind.INTERNAL and not message.lstrip().startswith(("[", "in ensemble")) and exc.status():
        return str(exc.status()).removeprefix("StatusCode.")  # a non-streaming call's own status
    return kind.value
