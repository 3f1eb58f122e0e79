"""A small streaming client for the `moss_tts` entry (and the `moss_tts_codes` ensemble).

One gRPC stream per utterance: responses of one request arrive in order. An utterance left early
is ended with an in-band STOP on its own stream (contract/tensors.py, STOP: engine row and vocoder
slot are freed), not a gRPC cancel, which can wedge or crash tritonserver 2.51 (docs/structure.md);
the stream is cancelled only when the stop is not answered in time, or for the moss_tts_codes
ensemble (which has no STOP). A text session (`text_session()`) is one gRPC stream too, carrying
one request per segment.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from moss_tts.contract import tensors as contract
from moss_tts.contract.errors import ErrorKind, classify
from moss_tts.contract.session_requests import SessionRequests
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


def stopped(client: grpcclient.InferenceServerClient, events: "queue.Queue", model: str, request_id: str,
            wait_s: float = STOP_WAIT_S) -> bool:
    """Stop the running request `request_id` on the client's open stream: send the STOP, then read
    the stream's `events` (the callback's (result, error) pairs) until both final responses (the
    stopped request's, an error or a final flag, and the STOP's own) have come. False when they did
    not come within `wait_s` (the caller cancels then)."""
    client.async_stream_infer(model, stop_inputs(request_id), request_id=f"{request_id}.stop",
                              enable_empty_final_response=True)
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


    def text_session(self, model: str = "moss_tts", codes: bool = False, **options) -> "TextSession":
        """A text session on one gRPC stream: send_text() pieces as they are written, end(), and
        read the audio from chunks(). `options` as build_inputs' (reference_audio, seed, ...)."""
        return TextSession(self.url, model=model, codes=codes, **options)


@dataclass(frozen=True)
class SessionChunk:
    segment: int  # which segment (request) of the session this audio speaks
    audio: np.ndarray  # [2, n] float32
    codes: Optional[np.ndarray]  # [n, 12] when the session was opened with codes=True
    is_final: bool  # the segment's last response


class TextSession:
    """Text in as it is written, one continuous audio stream out, one voice (moss_tts text sessions).

    The text is cut by moss_tts.contract.text_segments.TextSegmenter (by the text alone: sentence ends,
    long clauses); each segment is one request on ONE gRPC stream, all naming a SESSION_ID made
    here; the last carries SESSION_END. The server speaks them in order and continues one
    vocoder sequence across them. `chunks()` yields the audio as it comes; `cancel()` (or
    leaving a `with` block early) frees the session on the server at once: an in-band STOP for each
    request still running, then the stream half-closed (a gRPC cancel only if the STOPs are not
    answered within STOP_WAIT_S). The stream's callback counts the final responses (error responses
    included) and the ids of those with a final flag as they come, so the ending knows what still
    runs, whoever reads chunks(). send_text/flush/end may be called from another thread than the
    one reading chunks().
    """

    def __init__(self, url: str, model: str = "moss_tts", codes: bool = False, timeout: float = 600.0,
                 session_id: Optional[str] = None, segmenter=None, **options) -> None:
        from moss_tts.contract.text_segments import TextSegmenter

        self.session_id = session_id or uuid.uuid4().hex
        self.model = model
        self.timeout = timeout
        self.segmenter = segmenter or TextSegmenter()
        self.outputs = ["AUDIO", "CODES"] if codes else ["AUDIO"]
        self.plan = SessionRequests(options, id_prefix=f"{self.session_id}:")
        self.segments = self.plan.segments  # sent so far, in order
        self._events: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._is_ended = False
        self._is_done = False
        self._num_open = 0  # requests sent whose final (or error) response has not come yet
        self._sent_ids: list[str] = []  # every request sent on the stream, in order
        self._finals = 0  # final responses come so far, error responses included (the callback's count)
        self._final_ids: set[str] = set()  # ids of the responses come with a final flag
        self._came = threading.Condition(self._lock)
        self._client = grpcclient.InferenceServerClient(url)
        self._client.start_stream(callback=self._on_response)

    def _on_response(self, result, error) -> None:
        """tritonclient's stream thread: count the finals, then hand the response to chunks()."""
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            with self._came:
                self._finals += 1
                if error is None:
                    self._final_ids.add(result.get_response().id)
                self._came.notify_all()
        self._events.put((result, error))

    def send_text(self, delta: str) -> list[str]:
        """Add text; sends (and returns) the segments it completed."""
        return self._send(self.segmenter.push(delta))

    def flush(self) -> list[str]:
        """Speak what is buffered now, complete or not."""
        return self._send(self.segmenter.flush())

    def end(self) -> list[str]:
        """No more text: the rest is sent, the last request ends the session."""
        with self._lock:
            if self._is_ended:
                return []
            rest = self.segmenter.end()
            sent = [self._request(text, is_end=i == len(rest) - 1) for i, text in enumerate(rest)]
            if not rest and self.segments:
                self._request("", is_end=True)
            self._is_ended = True
            if not self.segments:
                self._events.put((None, None))  # nothing was said: chunks() ends at once
            return sent

    def _send(self, texts: list[str]) -> list[str]:
        with self._lock:
            if self._is_ended:
                raise ValueError("the session has ended: start a new one")
            return [self._request(text) for text in texts]

    def _request(self, text: str, is_end: bool = False) -> str:
        # plan.end_id is set before the send: the closing request's final may come back at once.
        request_id, options = self.plan.next(text, is_end)
        inputs = build_inputs(text, session_id=self.session_id, session_end=True if is_end else None, **options)
        self._num_open += 1
        self._sent_ids.append(request_id)
        self._client.async_stream_infer(self.model, inputs, request_id=request_id,
                                        outputs=[grpcclient.InferRequestedOutput(name) for name in self.outputs],
                                        enable_empty_final_response=True)
        return text

    def chunks(self) -> Iterator[SessionChunk]:
        """The audio of every segment, in order, until the session's end; raises
        InferenceServerException on a server error (the session is then closed there)."""
        while not self._is_done:
            result, error = self._events.get(timeout=self.timeout)
            if error is not None:  # every error response is its request's last
                with self._lock:
                    self._num_open -= 1
                    running = self._num_open > 0
                self._is_done = True
                self.close(cancel=running)  # no request left running: end the stream, no cancel
                raise error
            if result is None:
                self._is_done = True
                break
            response = result.get_response()
            is_final = response.parameters["triton_final_response"].bool_param
            if is_final:
                with self._lock:
                    self._num_open -= 1
            segment = self.plan.segment_of(response.id)
            if is_final and response.id == self.plan.end_id:
                self._is_done = True
            if segment is None:  # the closing request without text
                continue
            audio, codes = result.as_numpy("AUDIO"), result.as_numpy("CODES") if "CODES" in self.outputs else None
            if (audio is not None and audio.size) or is_final:  # an empty final response carries no tensor
                yield SessionChunk(segment, audio if audio is not None else np.zeros((2, 0), np.float32),
                                   None if "CODES" not in self.outputs else codes if codes is not None
                                   else np.zeros((0, contract.N_VQ), np.int32), is_final)
        self.close()

    def cancel(self) -> None:
        """Stop now: the server frees the session's engine row, vocoder sequence and voice."""
        self._is_done = True
        self.close(cancel=True)

    def close(self, cancel: bool = False) -> None:
        """End the stream. Its requests still running (asked to cancel, or the session not done) are
        stopped in-band first; then it is half-closed and read to its end. A gRPC cancel only when
        the STOPs are not answered in time: a cancel can wedge or crash tritonserver 2.51, and one
        of a stream whose requests have all ended can leave it holding moss_tts
        (perf/hold_repro/README.md)."""
        if self._client is not None:
            client, self._client = self._client, None
            try:
                stopped = not (cancel or not self._is_done) or self._stopped(client)
            except InferenceServerException:  # the stream had already failed: nothing left to stop
                stopped = False
            finally:
                client.stop_stream(cancel_requests=not stopped)
                client.close()

    def _stopped(self, client, wait_s: float = STOP_WAIT_S) -> bool:
        """A STOP for each request sent whose final flag has not come; True once every request's
        final (error or flag) and every STOP's own have come within `wait_s`."""
        with self._lock:
            running = [i for i in self._sent_ids if i not in self._final_ids]
            expected = len(self._sent_ids) + len(running)
        for request_id in running:
            client.async_stream_infer(self.model, stop_inputs(request_id), request_id=f"{request_id}.stop",
                                      enable_empty_final_response=True)
        with self._came:
            return self._came.wait_for(lambda: self._finals >= expected, timeout=wait_s)

    def __enter__(self) -> "TextSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["TTSClient", "Utterance", "TextSession", "SessionChunk", "build_inputs", "error_code",
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
