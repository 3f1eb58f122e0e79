"""A small streaming client for the `moss_tts` entry (and the `moss_tts_codes` ensemble).

One gRPC stream per utterance: responses of one request arrive in order. An utterance left early
is ended with an in-band STOP on its own stream (contract/tensors.py, STOP: engine row and vocoder
slot are freed), not a gRPC cancel, which can wedge or crash tritonserver 2.51 (docs/structure.md);
the stream is cancelled only when the stop is not answered in time, or for the moss_tts_codes
ensemble (which has no STOP). A text session (`text_session()`, client/text_session.py) is one gRPC stream too,
carrying one request per segment.
"""

from __future__ import annotations

import queue
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from moss_tts.contract import tensors as contract
from moss_tts.contract.errors import ErrorKind, classify
from moss_tts.contract.tensors import SAMPLE_RATE


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


STOP_WAIT_S = 5.0  # a stream sees its stop at its next chunk, or within 1 s while it waits


def stop_inputs(request_id: str) -> list[grpcclient.InferInput]:
    """A STOP request's inputs: TEXT empty (moss_tts's config requires it), STOP naming the request."""
    return [option_input("TEXT", ""), option_input("STOP", request_id)]


def send_stop(client: grpcclient.InferenceServerClient, model: str, request_id: str) -> None:
    """The STOP of request `request_id` on the client's open stream, its empty final asked for."""
    client.async_stream_infer(model, stop_inputs(request_id), request_id=contract.stop_request_id(request_id),
                              enable_empty_final_response=True)


def stopped(client: grpcclient.InferenceServerClient, events: "queue.Queue", model: str, request_id: str,
            wait_s: float = STOP_WAIT_S) -> bool:
    """Stop the running request `request_id` on the client's open stream: send the STOP, then read
    the stream's `events` (the callback's (result, error) pairs) until both final responses (the
    stopped request's, an error or a final flag, and the STOP's own) have come. False when they did
    not come within `wait_s` (the caller cancels then)."""
    send_stop(client, model, request_id)
    deadline, finals = time.monotonic() + wait_s, 0
    try:
        while finals < 2:
            result, error = events.get(timeout=max(0.0, deadline - time.monotonic()))
            finals += error is not None or result.get_response().parameters["triton_final_response"].bool_param
    except queue.Empty:
        return False
    return True


class TTSClient:
    def __init__(self, url: str = "localhost:8001") -> None:
        self.url = url

    def stream(self, inputs, model: str = "moss_tts", output: str = "AUDIO",
               timeout: float = 600.0) -> Iterator[np.ndarray]:
        """Yield each response's `output` as it arrives; raises InferenceServerException on error.
        Only `output` is requested: ask moss_tts for CODES and the vocoder is never called.
        Closing the generator early ends the request on the server (a STOP; a cancel for the
        moss_tts_codes ensemble, or when the stop is not answered in time)."""
        events: "queue.Queue" = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        finished = False
        request_id = uuid.uuid4().hex  # what a STOP names; unguessable, so no other client can stop it
        try:
            client.async_stream_infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(output)],
                                      request_id=request_id, enable_empty_final_response=True)
            while not finished:
                result, error = events.get(timeout=timeout)
                if error is not None:
                    finished = True
                    raise error
                # Before the yield: a consumer that stops at the last chunk leaves a finished request.
                finished = result.get_response().parameters["triton_final_response"].bool_param
                array = result.as_numpy(output)
                if array is not None and array.size:
                    yield array
        finally:
            try:
                if not finished and model == "moss_tts":
                    finished = stopped(client, events, model, request_id)
            except InferenceServerException:  # the stream had already failed: nothing left to stop
                pass
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


    def text_session(self, model: str = "moss_tts", codes: bool = False, **options) -> "TextSession":  # noqa: F821
        """A text session on one gRPC stream: send_text() pieces as they are written, end(), and
        read the audio from chunks(). `options` as build_inputs' (reference_audio, seed, ...)."""
        from client.text_session import TextSession  # it builds on this module's inputs and STOP

        return TextSession(self.url, model=model, codes=codes, **options)


__all__ = ["TTSClient", "Utterance", "build_inputs", "error_code",
           "InferenceServerException", "SAMPLE_RATE"]


def error_code(exc: InferenceServerException) -> str:
    """The gRPC code name of a server error (moss_tts.contract.classify): our messages are tagged
    "[CODE] ..." because gRPC stream responses carry no status code, and Triton's own refusals
    (wrong dtype or shape, a missing input, a dead stub) are recognised by their wording."""
    message = exc.message() or ""
    kind, _ = classify(message)
    if kind is ErrorKind.INTERNAL and not message.lstrip().startswith(("[", "in ensemble")) and exc.status():
        return str(exc.status()).removeprefix("StatusCode.")  # a non-streaming call's own status
    return kind.value
