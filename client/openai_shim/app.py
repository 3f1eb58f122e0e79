"""The FastAPI app: POST /v1/audio/speech, GET /v1/models, GET /health (+ /v1/audio/voices: voice_api.py,
WS /v1/audio/speech/stream: speech_ws.py).

It holds no model: each speech request becomes one gRPC stream to tritonserver's `moss_tts`
entry (triton_stream.py). A background task reads the models' heartbeats every second
(client/server_health.py): while one has stopped (a dead or wedged stub), /health and every
speech request answer 503 at once. A request is validated whole (body size, schema, limits, reference)
before anything reaches the server; the first Triton response is awaited before the HTTP status
is chosen, so server-side validation errors are still proper 4xx. After that, each chunk leaves as
soon as it arrives, converted and encoded (audio_output.AudioOutput: the response's rate, channels
and format, in any format), raw or as SSE; `"stream": false` collects the whole utterance into one
body instead. A client that goes away at any point cancels the Triton stream.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import os
import time
from contextlib import aclosing, asynccontextmanager
from typing import AsyncIterator, Awaitable, Optional, TypeVar

import anyio
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..server_health import HeartbeatMonitor
from . import errors
from .audio_format import seconds
from .audio_output import NO_AUDIO, AudioOutput, encode_whole
from .config import ShimConfig
from .errors import ApiError
from .references import load_reference
from .schema import SpeechRequest, triton_options
from .triton_stream import AudioStream, TritonSpeech
from .warm_up import warm_up
from .speech_ws import add_websocket_route
from .voice_api import add_voice_routes, saved_voice_inputs

log = logging.getLogger("openai_shim")
T = TypeVar("T")
DRAIN_BYTES = 16 << 20  # an oversized body is read (and dropped) this far so the client sees the 413
HEARTBEAT_POLL_S = 1.0


class ClientDisconnected(Exception):
    """The HTTP client went away before the response started."""


class CancellingStreamingResponse(StreamingResponse):
    """StreamingResponse that always watches for the client going away (also while it waits for
    the next Triton chunk) and always closes its body iterator, whose `finally` cancels the stream."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away during a send
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


def create_app(config: ShimConfig, triton: Optional[TritonSpeech] = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.triton = triton or TritonSpeech(config.triton_url, config.triton_model, config.response_timeout_s)
        app.state.heartbeat_problem = None
        # What exists now (modules, routes, pydantic models: ~80,000 objects) lives as long as the
        # process: out of the collector's sight, a full collection under load takes ~1 ms instead
        # of 20-90 ms of a stalled event loop (issue 31). Collected first: a dead cycle frozen with
        # them would never be freed (in the tests' process, an earlier shim's hung response and its
        # soxr resampler outlived the interpreter: nanobind's "leaked instances" at exit).
        gc.collect()
        gc.freeze()
        warming = asyncio.create_task(warm_up(app.state.triton))
        watcher = asyncio.create_task(watch_heartbeats(app, config)) if config.heartbeat_url else None
        yield
        warming.cancel()
        if watcher is not None:
            watcher.cancel()
        await app.state.triton.close()

    app = FastAPI(title="moss-tts-triton OpenAI-compatible speech API", lifespan=lifespan)
    created = int(time.time())
    add_voice_routes(app, config)
    add_websocket_route(app, config)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
        return JSONResponse(ApiError(exc.status_code, str(exc.detail), code=code).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:  # Starlette logs the traceback
        return JSONResponse(errors.internal(f"unexpected {type(exc).__name__}").body(), status_code=500)

    @app.get("/health")
    async def health(request: Request):
        problem = (request.app.state.heartbeat_problem
                   or await request.app.state.triton.problem(config.health_timeout_s))
        if problem is not None:
            raise errors.unavailable(problem)
        # pid: the worker process that answered (--workers: each has its own channel and watcher)
        return {"status": "ok", "triton_url": config.triton_url, "model": config.triton_model, "pid": os.getpid()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "OpenMOSS"}
                                           for name in config.served_names]}

    @app.post("/v1/audio/speech")
    async def create_speech(request: Request):
        if request.app.state.heartbeat_problem is not None:
            raise errors.unavailable(f"the TTS server is unhealthy: {request.app.state.heartbeat_problem}")
        require_json(request)
        speech = parse_speech(await read_body(request, config.max_body_bytes))
        check_limits(speech, config)
        values = {"TEXT": speech.input, **triton_options(speech), **await saved_voice_inputs(request.app, speech)}
        if speech.reference is not None:
            values["REFERENCE_AUDIO"] = await load_reference(*speech.reference, config)
        stream = request.app.state.triton.open(values)
        try:
            return await respond(request, speech, stream)
        except ClientDisconnected:
            return Response(status_code=499)
        finally:
            if not speech.is_streaming:
                await stream.aclose()

    return app


async def watch_heartbeats(app: FastAPI, config: ShimConfig) -> None:
    """Keep app.state.heartbeat_problem current (None = every model instance's heart beats)."""
    monitor = HeartbeatMonitor(config.heartbeat_url, config.heartbeat_stale_s)
    while True:
        problem = await asyncio.to_thread(monitor.poll)
        if problem != app.state.heartbeat_problem:
            (log.error if problem else log.warning)("heartbeats: %s", problem or "all models beat again")
        app.state.heartbeat_problem = problem
        await asyncio.sleep(HEARTBEAT_POLL_S)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > limit + DRAIN_BYTES:
            break
    if size > limit or (declared.isdigit() and int(declared) > limit):
        raise errors.too_large(f"the request body is larger than {limit} bytes (--max-body-bytes)")
    return b"".join(chunks)


def require_json(request: Request) -> None:
    """The body is JSON and must say so (a form post or text/plain is a client mistake: 415)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise ApiError(415, f"Content-Type must be application/json, got {media_type or 'none'!r}; send the "
                       f"request as a JSON object", param="Content-Type", code="unsupported_media_type")


def parse_speech(body: bytes) -> SpeechRequest:
    try:
        return SpeechRequest.model_validate_json(body)
    except ValidationError as exc:
        raise errors.from_validation(exc) from None


def check_limits(speech: SpeechRequest, config: ShimConfig) -> None:
    if speech.model is not None and not config.serves(speech.model):
        raise errors.model_not_found(speech.model, config.served_names)
    if len(speech.input) > config.max_input_chars:
        raise errors.bad_request(f"input has {len(speech.input)} characters, the limit is {config.max_input_chars}",
                                 "input", code="string_above_max_length")


async def respond(request: Request, speech: SpeechRequest, stream: AudioStream) -> Response:
    spec = speech.output
    headers = spec.headers()
    try:
        first = await until_disconnect(request, anext(stream, None), stream)
    except BaseException:
        await stream.aclose()
        raise
    first = NO_AUDIO if first is None else first
    if not speech.is_streaming:
        chunks = [first] + await until_disconnect(request, collect(stream), stream)
        body = await asyncio.to_thread(encode_whole, np.concatenate(chunks, axis=1), spec)
        return Response(body, media_type=spec.format.media_type, headers=headers)
    headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if speech.stream_format == "sse":
        return CancellingStreamingResponse(sse_events(first, stream, AudioOutput(spec)),
                                           media_type="text/event-stream", headers=headers)
    return CancellingStreamingResponse(raw_audio(first, stream, AudioOutput(spec)), media_type=spec.format.media_type,
                                       headers=headers)


async def until_disconnect(request: Request, awaitable: Awaitable[T], stream: AudioStream) -> T:
    """Await `awaitable` unless the client goes away first; then cancel the Triton stream."""
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
    if work in done:
        return work.result()
    await stream.aclose()
    raise ClientDisconnected()


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect(stream: AudioStream) -> list[np.ndarray]:
    return [chunk async for chunk in stream]


async def encoded(first: np.ndarray, stream: AudioStream, output: AudioOutput) -> AsyncIterator[bytes]:
    """The response's bytes as each chunk completes them (empty pieces left out), then the rest.
    FFmpeg's formats are encoded on a worker thread (FFmpeg releases the GIL): an mp3 costs 3% (24 kHz
    mono) to 9% (48 kHz stereo) of one core per second of audio (README, "Audio"), which would otherwise
    stall every other stream of this event loop; pcm and wav are converted here (AudioOutput.is_light)."""
    async def run(work, *args) -> bytes:
        return work(*args) if output.is_light else await asyncio.to_thread(work, *args)

    try:
        chunk = first
        while chunk is not None:
            data = await run(output.push, chunk)
            if data:
                yield data
            chunk = await anext(stream, None)
        data = await run(output.finish)
        if data:
            yield data
    finally:
        output.close()
        await stream.aclose()


async def raw_audio(first: np.ndarray, stream: AudioStream, output: AudioOutput) -> AsyncIterator[bytes]:
    """Chunked audio bytes; an error mid-stream aborts the connection (there is no way to say more)."""
    try:
        async with aclosing(encoded(first, stream, output)) as pieces:
            async for data in pieces:
                yield data
    except ApiError as exc:
        log.warning("stream aborted mid-way: %s", exc)
        raise


def sse(event: dict) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def audio_delta(data: bytes) -> bytes:
    return sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})


async def sse_events(first: np.ndarray, stream: AudioStream, output: AudioOutput) -> AsyncIterator[bytes]:
    """speech.audio.delta events (base64 of the same bytes the raw stream carries, in order: their
    concatenation is the file), then speech.audio.done; an error mid-stream becomes one `error` event."""
    try:
        async with aclosing(encoded(first, stream, output)) as pieces:
            async for data in pieces:
                yield audio_delta(data)
        frames = output.num_frames  # the request is one segment here: docs/websocket.md, "Timestamps"
        yield sse({"type": "speech.audio.done", "segments": [{"index": 0, "start_s": 0.0, "end_s": seconds(frames)}],
                   "usage": {"input_tokens": 0, "output_tokens": frames, "total_tokens": frames}})
    except ApiError as exc:
        yield sse({"type": "error", **exc.body()})
