"""WS /v1/audio/speech/stream: text in as it is written, one continuous audio stream out, one voice.

One WebSocket connection is one text session (docs/structure.md, "Text sessions"): the text is cut
by moss_tts.contract.text_segments.TextSegmenter here, each segment is one request on ONE gRPC stream to
`moss_tts`, all naming one SESSION_ID; the last carries SESSION_END. The protocol
(docs/websocket.md) is modelled on ElevenLabs' stream-input: options first, then text deltas,
flush, end; audio comes back as binary frames, events as JSON text frames.

The connection is read by one task (client messages, idle timeout) while another forwards the
Triton responses; a client that goes away, a cancel, an idle timeout or a protocol violation
cancels the gRPC call at once, which makes the server free the session, its engine row and its
vocoder sequence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import grpc
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from moss_tts.contract import tensors as contract
from moss_tts.contract.session_requests import SessionRequests
from moss_tts.contract.text_segments import TextSegmenter

from . import errors
from .audio_output import NO_AUDIO, AudioOutput
from .config import ShimConfig
from .errors import ApiError
from .session_options import session_inputs
from .triton_stream import AUDIO_ONLY, build_inputs

log = logging.getLogger("openai_shim")

# Close codes (RFC 6455): 1000 done or cancelled, 1008 a protocol violation or a limit, 1003 a binary
# frame from the client, 1011 the synthesis failed, 1013 the TTS server is unavailable.
NORMAL, UNSUPPORTED_DATA, POLICY, SERVER_ERROR, TRY_LATER = 1000, 1003, 1008, 1011, 1013


class ProtocolViolation(Exception):
    """Close the connection with `code` and this message as the reason."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


def error_event(exc: ApiError) -> dict:
    return {"type": "error", "status": exc.status, **exc.body()}


def add_websocket_route(app: FastAPI, config: ShimConfig) -> None:
    @app.websocket("/v1/audio/speech/stream")
    async def speech_stream(websocket: WebSocket):
        await websocket.accept()
        session = WsSession(websocket, app, config)
        try:
            await session.run()
        except WebSocketDisconnect:
            pass
        finally:
            await session.cancel()


class WsSession:
    def __init__(self, websocket: WebSocket, app: FastAPI, config: ShimConfig):
        self.ws, self.app, self.config = websocket, app, config
        self.session_id = uuid.uuid4().hex
        self.segmenter = TextSegmenter()
        self.plan = SessionRequests({})  # replaced once the options are known
        self.requests: asyncio.Queue = asyncio.Queue()
        self.call = None
        self.is_ended = False
        self.is_done = False

    async def send_event(self, event: dict) -> None:
        await self.ws.send_text(json.dumps(event, separators=(",", ":")))

    async def close(self, code: int, reason: str) -> None:
        await self.cancel()
        try:
            await self.ws.close(code, reason.encode()[:123].decode(errors="ignore"))
        except (RuntimeError, OSError):  # already closed
            pass

    async def cancel(self) -> None:
        """Stop the gRPC call unless it finished: the server frees the session at once."""
        if self.call is not None and not self.is_done:
            self.call.cancel()
        self.is_done = True
        self.requests.put_nowait(None)

    async def run(self) -> None:
        try:
            await self.open()
        except ProtocolViolation as exc:
            await self.close(exc.code, str(exc))
            return
        reader = asyncio.ensure_future(self.read_messages())
        forwarder = asyncio.ensure_future(self.forward_audio())
        try:
            # Done (the forwarder sent `done`), cancelled, a protocol violation, a client gone: the
            # first to finish ends the session; the reader goes on reading after `end` for a cancel.
            await asyncio.wait({reader, forwarder}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, forwarder):
                task.cancel()
        for task in (reader, forwarder):
            if task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                if isinstance(exc, ProtocolViolation):
                    await self.close(exc.code, str(exc))
                    return
                if isinstance(exc, WebSocketDisconnect):
                    raise exc
                if isinstance(exc, ApiError):
                    await self.send_safely(error_event(exc))
                    code = TRY_LATER if exc.status in (429, 503) else SERVER_ERROR if exc.status >= 500 else POLICY
                    await self.close(code, exc.message)
                    return
                raise exc

    async def send_safely(self, event: dict) -> None:
        try:
            await self.send_event(event)
        except (RuntimeError, OSError, WebSocketDisconnect):
            pass

    async def receive(self) -> dict:
        """The next client message as a JSON object; ProtocolViolation for anything else."""
        idle_timeout_s = None if self.is_ended else self.config.ws_idle_timeout_s  # after `end`: the audio's turn
        try:
            async with asyncio.timeout(idle_timeout_s):  # no task per message (wait_for's)
                message = await self.ws.receive()
        except TimeoutError:
            raise ProtocolViolation(POLICY, f"no message for {self.config.ws_idle_timeout_s:g} s "
                                            f"(--ws-idle-timeout)") from None
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        if message.get("text") is None:
            raise ProtocolViolation(UNSUPPORTED_DATA, "binary frames are not accepted: send JSON text messages")
        try:
            data = json.loads(message["text"])
        except ValueError:
            raise ProtocolViolation(POLICY, "a message is not JSON") from None
        if not isinstance(data, dict):
            raise ProtocolViolation(POLICY, "a message must be a JSON object")
        return data

    async def open(self) -> None:
        """Options until valid ones come (each bad one, a bad reference too, gets an error event:
        session_options.py), then the gRPC stream."""
        while True:
            data = await self.receive()
            if data.get("type", "options") != "options":
                raise ProtocolViolation(POLICY, f"the first message must be the session options, got type "
                                                f"{data.get('type')!r}")
            if self.app.state.heartbeat_problem is not None:
                raise ProtocolViolation(TRY_LATER, "the TTS server is unhealthy")
            try:
                self.speech, inputs = await session_inputs(data, self.app, self.config)
                break
            except ApiError as exc:
                await self.send_event(error_event(exc))
        self.plan = SessionRequests(inputs)
        spec = self.speech.output
        self.output = AudioOutput(spec)  # one stream for the session: its segments join without a seam
        await self.send_event({"type": "session.started", "session_id": self.session_id,
                               "response_format": spec.format.name, "sample_rate": spec.sample_rate,
                               "channels": spec.channels, "sample_format": "s16le"})
        if spec.format.name == "wav":  # the header (of unknown length) first, as the HTTP stream sends it
            await self.ws.send_bytes(self.output.push(NO_AUDIO))

        async def requests():
            while (request := await self.requests.get()) is not None:
                yield request
            # half-closing early would end the stream before the responses: stay open until done

        self.call = self.app.state.triton.stream(requests())

    def send_segments(self, texts: list[str], is_end: bool = False) -> None:
        for i, text in enumerate(texts):
            self.request(text, is_end and i == len(texts) - 1)
        if is_end and not texts:
            self.request("", True)

    @property
    def segments(self) -> list[str]:
        return self.plan.segments

    def request(self, text: str, is_end: bool) -> None:
        # plan.end_id is set before the send: the closing request's final may come back at once.
        request_id, options = self.plan.next(text, is_end)
        values = {"TEXT": text, **options, "SESSION_ID": self.session_id, "SESSION_END": True if is_end else None}
        self.requests.put_nowait({"model_name": self.app.state.triton.model, "inputs": build_inputs(values),
                                  "request_id": request_id, "outputs": AUDIO_ONLY,
                                  "parameters": {"triton_enable_empty_final_response": True}})

    async def read_messages(self) -> None:
        """Text, flush, end, cancel; after `end` only a cancel (or the client going away) counts."""
        while True:
            data = await self.receive()
            kind = data.get("type")
            if self.is_ended and kind in ("text", "flush", "end"):
                await self.send_event(error_event(errors.bad_request(
                    f"the input has ended: {kind!r} after 'end' is ignored", "type", code="input_ended")))
            elif kind == "text":
                text = data.get("text")
                if not isinstance(text, str):
                    await self.send_event(error_event(errors.bad_request("text must be a string", "text")))
                    continue
                if len(self.segmenter.buffered) + len(text) > self.config.ws_max_buffered_chars:
                    raise ProtocolViolation(POLICY, f"more than {self.config.ws_max_buffered_chars} characters "
                                                    f"of text not yet spoken (--ws-max-buffered-chars)")
                self.send_segments(self.segmenter.push(text))
            elif kind == "flush":
                self.send_segments(self.segmenter.flush())
            elif kind == "end":
                self.is_ended = True
                if not self.segments and not self.segmenter.buffered.strip():
                    self.is_done = True  # nothing was said: no request at all
                    self.requests.put_nowait(None)
                    await self.send_event({"type": "done", "segments": 0, "frames": 0})
                    await self.ws.close(NORMAL, "done")
                    return
                self.send_segments(self.segmenter.end(), is_end=True)
            elif kind == "cancel":
                await self.cancel()
                await self.send_event({"type": "done", "cancelled": True, "segments": len(self.segments)})
                await self.ws.close(NORMAL, "cancelled")
                return
            elif kind == "options":
                await self.send_event(error_event(errors.bad_request(
                    "the options were set by the first message; open a new connection for other options", "type")))
            else:
                await self.send_event(error_event(errors.bad_request(
                    f"unknown message type {kind!r}: use text, flush, end or cancel", "type",
                    code="unknown_message_type")))

    async def forward_audio(self) -> None:
        """Audio as binary frames, a segment.done event after each segment, done after the last."""
        frames, total = 0, 0
        while True:
            try:
                async with asyncio.timeout(self.config.response_timeout_s):  # no task per chunk (wait_for's)
                    result = await self.call.__anext__()
            except TimeoutError:
                raise errors.timeout(f"tritonserver sent nothing for {self.config.response_timeout_s:g} s "
                                     f"(--response-timeout); the session was cancelled") from None
            except grpc.aio.AioRpcError as exc:
                if self.is_done:
                    return
                raise errors.from_grpc(exc) from None
            except StopAsyncIteration:
                if self.is_done:
                    return
                raise errors.internal("tritonserver closed the stream without a final response") from None
            result, error = result
            if error is not None:
                self.is_done = True
                raise errors.from_triton_message(error.message())
            response = result.get_response()
            audio = result.as_numpy("AUDIO")
            if audio is not None and audio.size:
                frames += audio.shape[1] // contract.SAMPLES_PER_FRAME
                if data := self.output.push(audio):
                    await self.ws.send_bytes(data)
            if not response.parameters["triton_final_response"].bool_param:
                continue
            index = self.plan.segment_of(response.id)
            if index is not None:
                await self.send_event({"type": "segment.done", "index": index, "text": self.segments[index],
                                       "frames": frames})
                total, frames = total + frames, 0
            if response.id == self.plan.end_id:
                self.is_done = True
                self.requests.put_nowait(None)
                if tail := self.output.finish():  # the resampler's last milliseconds
                    await self.ws.send_bytes(tail)
                await self.send_event({"type": "done", "segments": len(self.segments), "frames": total})
                await self.ws.close(NORMAL, "done")
                return


