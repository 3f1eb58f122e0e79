"""TextSession: text in as it is written, one continuous audio stream out (moss_tts text sessions
over gRPC), the client side of `TTSClient.text_session()` (client/tts_client.py)."""

from __future__ import annotations

import queue
import threading
import uuid
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import tritonclient.grpc as grpcclient

from client.tts_client import STOP_WAIT_S, InferenceServerException, build_inputs, send_stop
from moss_tts.contract import tensors as contract
from moss_tts.contract.session_requests import SessionRequests


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
            send_stop(client, self.model, request_id)
        with self._came:
            return self._came.wait_for(lambda: self._finals >= expected, timeout=wait_s)

    def __enter__(self) -> "TextSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
