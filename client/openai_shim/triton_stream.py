"""tritonclient.grpc.aio streaming to the `moss_tts` entry: one gRPC stream per utterance.

`AudioStream` is an async iterator over AUDIO chunks [2, n] float32. Its request stream stays
open until the final response (as client.tts_client does); `aclose()` before that cancels the
gRPC call, which makes tritonserver cancel the request, and the entry frees the engine row and
the vocoder session. Errors become `ApiError` (errors.py); no response within
`response_timeout_s` cancels the call and raises 504.

A stream whose request has ended (final or error response) is never cancelled: `read_to_end`
half-closes it and reads it to the server's status. Cancelling it instead can leave tritonserver
2.51 holding the model for good (perf/hold_repro/README.md); so can closing the channel while
such a call is still open, which is why the soak and the benchmark read every stream to its end.
"""

from __future__ import annotations

import asyncio
from typing import Optional

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from moss_tts.contract import tensors as contract

from . import errors

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


class AudioStream:
    """The AUDIO chunks of one utterance, in order."""

    def __init__(self, client: grpcclient.InferenceServerClient, model: str, inputs, response_timeout_s: float):
        self._timeout = response_timeout_s
        self._closed = asyncio.Event()
        self._finished = False

        async def requests():
            yield {"model_name": model, "inputs": inputs, "outputs": AUDIO_ONLY,
                   "parameters": {"triton_enable_empty_final_response": True}}
            await self._closed.wait()  # half-closing early would end the stream before the responses

        self._call = client.stream_infer(requests())

    def __aiter__(self) -> "AudioStream":
        return self

    async def __anext__(self) -> np.ndarray:
        while not self._finished:
            result, error = await self._next_response()
            if error is not None:
                self._finished = True  # aclose() ends the stream
                raise errors.from_triton_message(error.message())
            if result.get_response().parameters["triton_final_response"].bool_param:
                self._finished = True
            audio = result.as_numpy("AUDIO")
            if audio is not None and audio.size:
                return audio  # the last chunk goes out first; the stream is ended on the next call
        await self._end()
        raise StopAsyncIteration

    async def _next_response(self):
        try:
            async with asyncio.timeout(self._timeout):  # wait_for would make a task per chunk
                return await self._call.__anext__()
        except TimeoutError:
            await self.aclose()
            raise errors.timeout(f"tritonserver sent nothing for {self._timeout:g} s (--response-timeout); "
                                 f"the request was cancelled") from None
        except grpc.aio.AioRpcError as exc:
            self._finish()
            raise errors.from_grpc(exc) from None
        except StopAsyncIteration:
            self._finish()
            raise errors.internal("tritonserver closed the stream without a final response") from None

    def _finish(self) -> None:
        self._finished = True
        self._closed.set()

    async def _end(self) -> None:
        """Once the request has ended: the stream read to its status (once)."""
        if not self._closed.is_set():
            await read_to_end(self._call, self._closed)

    @property
    def is_finished(self) -> bool:
        return self._finished

    async def aclose(self) -> None:
        """Cancel the request on the server unless it already finished (then end the stream
        without a cancel); safe to call twice."""
        if not self._finished:
            self._call.cancel()
            self._finish()
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
        await self._client.close()
