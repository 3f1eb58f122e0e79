"""tritonclient.grpc.aio streaming to the `moss_tts` entry: one gRPC stream per utterance.

`AudioStream` is an async iterator over AUDIO chunks [2, n] float32. Its request stream stays
open until the final response (as client.tts_client does); `aclose()` before that (the HTTP
client went away) ends the request with an in-band STOP: a second request on the same stream
naming the first's id (contract/tensors.py, STOP), after which both requests' final responses are
read and the stream is half-closed, so tritonserver never sees a cancel. A gRPC cancel processed
while a response is being sent can wedge or crash tritonserver 2.51 (docs/structure.md, "A wedge
of 2.51's gRPC stream handler"). Only a server that does not end the stopped request within
`STOP_WAIT_S` gets the call cancelled. Errors become `ApiError` (errors.py); no response within
`response_timeout_s` stops the request the same way and raises 504.

A stream whose request has ended (final or error response) is never cancelled: it is half-closed
and read to the server's status (AudioStream's reader; `read_to_end` for the soak, the benchmark
and the WebSocket's raw calls). Cancelling it instead can leave tritonserver
2.51 holding the model for good (perf/hold_repro/README.md); so can closing the channel while
such a call is still open, which is why the soak and the benchmark read every stream to its end.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Optional

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from moss_tts.contract import tensors as contract

from . import errors
from .call_reader import ENDINGS, CallEnded, CallReader, is_final, keep, queued_requests

# tritonclient's own message-size options, plus a reconnect backoff capped at 1 s: gRPC's default
# backoff grows to 120 s, so a shim started before tritonserver answered 503 for ~24 s after the
# server became ready.
CHANNEL_ARGS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1),
                ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 1000)]
# A url that names a resolver (dns:///name:port, e.g. a Kubernetes headless Service) may give many
# servers: every RPC, so every stream, goes to the next ready one (gRPC's default, pick_first, would
# send them all down one connection). The resolver runs again when a server closes a connection
# (tritonserver --grpc-max-connection-age), at most every 5 s instead of gRPC's 30 s, so new pods
# are found and draining ones dropped soon after (docs/kubernetes.md).
RESOLVER_SCHEMES = ("dns:", "ipv4:", "ipv6:")
BALANCED_CHANNEL_ARGS = [("grpc.lb_policy_name", "round_robin"), ("grpc.dns_min_time_between_resolutions_ms", 5000)]


def channel_args(url: str) -> list[tuple[str, object]]:
    """The shim's gRPC channel options for `url`: per-RPC round robin when it names a resolver."""
    return CHANNEL_ARGS + (BALANCED_CHANNEL_ARGS if url.startswith(RESOLVER_SCHEMES) else [])


END_TIMEOUT_S = 10.0  # a server that does not end a finished stream by then gets it cancelled
# A stream checks for its stop at each chunk or at most 1 s apart while it waits (speech_stream.py).
STOP_WAIT_S = 5.0
# The shim sends AUDIO only: without a list the server would make and send CODES with every chunk.
AUDIO_ONLY = [grpcclient.InferRequestedOutput("AUDIO")]


async def read_to_end(call, closed: asyncio.Event, timeout_s: float = END_TIMEOUT_S) -> None:
    """End a stream whose requests have all ended without cancelling it: half-close (`closed` is
    the event the request iterator waits on) and read on to the server's status. Only if that
    takes longer than `timeout_s` is the call cancelled."""
    closed.set()

    async def drain() -> None:
        try:
            async for _ in call:  # nothing is left but the status
                pass
        except grpc.aio.AioRpcError:  # ended with a non-OK status: ended all the same
            pass

    try:
        await asyncio.wait_for(drain(), timeout_s)
    except (TimeoutError, asyncio.TimeoutError):
        call.cancel()


def build_inputs(values: dict[str, object]) -> list[grpcclient.InferInput]:
    """{"TEXT": "...", "SEED": 1, ...} -> inputs typed and shaped by moss_tts.contract.input_array
    ([1], REFERENCE_CODES [1, frames, 12]); None values are left out."""
    inputs = []
    for name, value in values.items():
        if value is None:
            continue
        array = contract.input_array(name, value)
        tensor = grpcclient.InferInput(name, list(array.shape), contract.INPUTS[name].dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def stop_request(model: str, request_id: str) -> dict:
    """The in-band STOP of request `request_id` (TEXT empty, as moss_tts's config requires TEXT),
    under an id of its own; its empty final response is asked for, so the client sees it end."""
    return {"model_name": model, "inputs": build_inputs({"TEXT": "", "STOP": request_id}),
            "request_id": contract.stop_request_id(request_id), "parameters": {"triton_enable_empty_final_response": True}}


class AudioStream:
    """The AUDIO chunks of one utterance, in order. Its call is read by a CallReader (a task of its
    own: a cancelled consumer must never cancel the RPC), and ending it early (aclose) is a task of
    its own too, so that a cancelled handler still ends the request by the STOP and the half-close.

    Every AudioStream must be ended by aclose() or by reading it to its end (app.py does on every
    path): the reader task holds it, so one dropped unended keeps its call open. The reader takes
    responses as fast as the server sends them, so a slow HTTP client holds its utterance's audio
    here rather than holding a send of the server's stream thread (at most one utterance: 30 MB a
    minute of 48 kHz stereo float32)."""

    def __init__(self, client: grpcclient.InferenceServerClient, model: str, inputs, response_timeout_s: float,
                 stop_wait_s: float = STOP_WAIT_S):
        self._timeout = response_timeout_s
        self._stop_wait_s = stop_wait_s
        self._model = model
        self._finished = False
        # How aclose() ended a running request: "stopped" (its STOP answered), "cancelled" (the gRPC
        # fallback), "call ended" (the server ended the call meanwhile), None (it had ended by
        # itself, or aclose() was not called).
        self.ended_by: Optional[str] = None
        self._ending: Optional[asyncio.Task] = None
        self._request_id = uuid.uuid4().hex  # what a STOP names; unguessable, so no other client can stop it
        # The call's requests: this one, then maybe its STOP, then None, the half-close.
        self._requests: asyncio.Queue = asyncio.Queue()
        self._requests.put_nowait({"model_name": model, "inputs": inputs, "outputs": AUDIO_ONLY,
                                   "request_id": self._request_id,
                                   "parameters": {"triton_enable_empty_final_response": True}})
        self._call = client.stream_infer(queued_requests(self._requests))
        self._reader = CallReader(self._call)

    def __aiter__(self) -> "AudioStream":
        return self

    async def __anext__(self) -> np.ndarray:
        if self._ending is not None:  # being ended (aclose): its responses are the ending's
            await asyncio.shield(self._ending)
            raise StopAsyncIteration
        while not self._finished:
            result, error = await self._next_response()
            if error is not None:
                self._finished = True  # aclose() ends the stream
                raise errors.from_triton_message(error.message())
            if is_final(result):
                self._finished = True
            audio = result.as_numpy("AUDIO")
            if audio is not None and audio.size:
                return audio  # the last chunk goes out first; the stream is ended on the next call
        await self._end()
        raise StopAsyncIteration

    async def _next_response(self):
        try:
            return await self._reader.next(self._timeout)
        except TimeoutError:
            await self.aclose()
            raise errors.timeout(f"tritonserver sent nothing for {self._timeout:g} s (--response-timeout); "
                                 f"the request was stopped") from None
        except CallEnded as ended:
            self._finished = True
            self._requests.put_nowait(None)
            if isinstance(ended.cause, grpc.aio.AioRpcError):
                raise errors.from_grpc(ended.cause) from None
            raise errors.internal("tritonserver closed the stream without a final response") from None

    async def _end(self) -> None:
        """Once the request has ended: half-close the stream and let the reader read it to its
        status (once); only a server that does not end it within END_TIMEOUT_S gets it cancelled."""
        self._requests.put_nowait(None)
        if not await self._reader.until_status(END_TIMEOUT_S):
            self._call.cancel()

    @property
    def is_finished(self) -> bool:
        return self._finished

    async def aclose(self) -> None:
        """End the request on the server unless it already finished: an in-band STOP, both final
        responses read (the stopped request's, an error or a final flag, and the STOP's own), then
        the stream half-closed and read to its status; a gRPC cancel only when the finals do not
        come within the stop's wait. Runs as a task of its own, which a cancel of the caller does
        not stop. Safe to call twice."""
        if self._ending is None:
            self._ending = keep(asyncio.ensure_future(self._end_request(stop=not self._finished)), ENDINGS)
            self._finished = True
        await asyncio.shield(self._ending)

    async def _end_request(self, stop: bool) -> None:
        if stop:
            self._requests.put_nowait(stop_request(self._model, self._request_id))
            # Two finals since the call began: the request's own (a final flag or an error, maybe
            # already read) and the STOP's. The reader counts them, whoever reads the queue.
            if await self._reader.until_finals(2, self._stop_wait_s):
                self.ended_by = "stopped"
            elif self._reader.is_ended:  # the server ended the call first (it shuts down): nothing to cancel
                self.ended_by = "call ended"
            else:
                self._call.cancel()
                self.ended_by = "cancelled"
        await self._end()


class TritonSpeech:
    """One gRPC channel to tritonserver, shared by every request of the shim."""

    def __init__(self, url: str, model: str, response_timeout_s: float):
        self.model = model
        self.response_timeout_s = response_timeout_s
        self._client = grpcclient.InferenceServerClient(url, channel_args=channel_args(url))

    def open(self, values: dict[str, object]) -> AudioStream:
        return AudioStream(self._client, self.model, build_inputs(values), self.response_timeout_s)

    def stream(self, requests):
        """A raw stream_infer call (the WebSocket's text session, speech_ws.py): `requests` is an async
        iterator of request dicts; the call yields (result, error) pairs; `.cancel()` cancels it."""
        return self._client.stream_infer(requests)

    async def encode_reference(self, audio: bytes) -> np.ndarray:
        """Reference file bytes -> codes [frames, 12] by the server's ref_encoder (one non-streaming
        call); its refusals become ApiError like a speech request's."""
        tensor = grpcclient.InferInput("REFERENCE_AUDIO", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([audio], dtype=np.object_).reshape(1, 1))
        try:
            result = await self._client.infer("ref_encoder", [tensor], client_timeout=self.response_timeout_s)
        except InferenceServerException as exc:
            raise errors.from_triton_message(exc.message() or str(exc)) from None
        return result.as_numpy("REFERENCE_CODES")[0]

    async def problem(self, timeout_s: float) -> Optional[str]:
        """None when tritonserver is ready and serves the model, else what is wrong."""
        try:
            if not await self._client.is_server_ready(client_timeout=timeout_s):
                return "tritonserver is not ready"
            if not await self._client.is_model_ready(self.model, client_timeout=timeout_s):
                return f"model {self.model!r} is not ready"
        except Exception as exc:  # unreachable, deadline, ... all mean not healthy
            return f"tritonserver is unreachable: {type(exc).__name__}"
        return None

    async def close(self) -> None:
        """Close the channel once the streams being ended (STOPs, half-closes) are done, or after the
        longest an ending takes: closing it under them would cancel their calls."""
        if ENDINGS:
            await asyncio.wait(set(ENDINGS), timeout=STOP_WAIT_S + END_TIMEOUT_S)
        await self._client.close()
