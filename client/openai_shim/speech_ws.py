"""WS /v1/audio/speech/stream: text in as it is written, audio out; several contexts on one socket.

The protocol (docs/websocket.md) is modelled on ElevenLabs' stream-input and multi-context
WebSockets: options first, then text deltas, flush, end. A message without `context_id` acts on
the default context (the one-context protocol: binary audio, and its done closes the socket); a
message naming a `context_id` acts on that context only (ws_context.SpeechContext: its own text
session, gRPC stream and audio, sent as JSON `audio` events). Errors naming a context never close
the socket; protocol violations do (ws_protocol.py).

The connection is read by one task (client messages, the idle timeout); each context's forwarder
sends its audio as the responses arrive. A client that goes away, a cancel, an idle timeout or a
protocol violation cancels the contexts' gRPC calls at once, which makes the server free each
session, its engine row and its vocoder sequence.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Optional

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from . import errors
from .config import ShimConfig
from .errors import ApiError
from .session_options import context_inputs, session_inputs
from .ws_context import SpeechContext
from .ws_idle import IdleTimer
from .ws_protocol import (NORMAL, POLICY, TRY_LATER, UNSUPPORTED_DATA, ProtocolViolation, close_code, context_ended,
                          context_exists, error_event, input_ended, invalid_context_id, is_context_id,
                          too_many_contexts, unknown_context, unknown_type)

# Ended ids are remembered (not reused on a socket) up to this many, the oldest forgotten first:
# a socket that lives for hours of turns keeps ~64 bytes per id at most this often.
ENDED_IDS_KEPT = 4096


def add_websocket_route(app: FastAPI, config: ShimConfig) -> None:
    @app.websocket("/v1/audio/speech/stream")
    async def speech_stream(websocket: WebSocket):
        await websocket.accept()
        connection = WsConnection(websocket, app, config)
        try:
            await connection.run()
        except WebSocketDisconnect:
            pass
        finally:
            await connection.cancel_all(send_done=False)


class WsConnection:
    def __init__(self, websocket: WebSocket, app: FastAPI, config: ShimConfig):
        self.ws, self.app, self.config = websocket, app, config
        self.session_id = uuid.uuid4().hex  # the default context's, announced by session.started
        self.speech = None  # the socket's options (SessionOptions) and their moss_tts inputs
        self.inputs: dict = {}
        self.default: Optional[SpeechContext] = None  # made on its first text, flush or end
        self.default_finished = asyncio.Event()  # its done or error event has left
        self.contexts: dict[str, SpeechContext] = {}  # the named ones still open
        self.ended_ids: dict[str, None] = {}  # insertion-ordered set
        self.idle = IdleTimer(config.ws_idle_timeout_s, "--ws-idle-timeout", self.is_audio_turn)

    async def send_event(self, event: dict) -> None:
        await self.ws.send_text(json.dumps(event, separators=(",", ":")))

    async def send_bytes(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def send_error(self, exc: ApiError, context_id: Optional[str] = None) -> None:
        await self.send_event(error_event(exc, context_id))

    # --- the socket's life ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self.open()
        except ProtocolViolation as exc:
            await self.close(exc.code, str(exc))
            return
        reader = asyncio.ensure_future(self.read_messages())
        ender = asyncio.ensure_future(self.default_finished.wait())
        try:
            # The reader ends on cancel, close_socket, a violation or a client gone; the default
            # context's done or failure ends the socket too (the one-context protocol).
            await asyncio.wait({reader, ender}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, ender):
                task.cancel()
        if not reader.done() or reader.cancelled():
            failure = self.default.failure
            if failure is None:
                await self.close_socket("done")
            else:
                await self.close(close_code(failure), failure.message)
            return
        exc = reader.exception()
        if isinstance(exc, ProtocolViolation):
            await self.close(exc.code, str(exc))
        elif exc is not None:
            raise exc

    async def close(self, code: int, reason: str) -> None:
        await self.cancel_all(send_done=False)
        try:
            await self.ws.close(code, reason.encode()[:123].decode(errors="ignore"))
        except (RuntimeError, OSError):  # already closed
            pass

    async def close_socket(self, reason: str) -> None:
        """Every context still open gets its cancelled done, then a normal close."""
        await self.cancel_all(send_done=True)
        await self.close(NORMAL, reason)

    async def cancel_all(self, send_done: bool) -> None:
        for context in [*self.contexts.values(), self.default]:
            if context is not None:
                await context.cancel(send_done)

    def context_over(self, context: SpeechContext) -> None:
        """A context ended (SpeechContext.on_over): out of the limit, its id never reused; the idle
        timeout counts again once no context is speaking after its end."""
        if context.context_id is not None:
            self.contexts.pop(context.context_id, None)
            self.ended_ids[context.context_id] = None
            if len(self.ended_ids) > ENDED_IDS_KEPT:
                del self.ended_ids[next(iter(self.ended_ids))]
        self.idle.rearm(audio_ended=context.is_ended)

    @property
    def num_open(self) -> int:
        """Contexts that count against --ws-max-contexts: the named open ones, the default in use."""
        return len(self.contexts) + (self.default is not None and not self.default.is_over)

    # --- reading ----------------------------------------------------------------------------------

    def is_audio_turn(self) -> bool:
        """A context speaks after its end: the idle timeout waits for it."""
        return any(context is not None and context.is_speaking_after_end
                   for context in [*self.contexts.values(), self.default])

    async def receive(self) -> dict:
        """The next client message as a JSON object; ProtocolViolation for anything else."""
        message = await self.idle.wait(self.ws.receive())
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
        session_options.py); then session.started, and the context the options name, if any."""
        while True:
            data = await self.receive()
            if data.get("type", "options") != "options":
                raise ProtocolViolation(POLICY, f"the first message must be the session options, got type "
                                                f"{data.get('type')!r}")
            if self.app.state.heartbeat_problem is not None:
                raise ProtocolViolation(TRY_LATER, "the TTS server is unhealthy")
            context_id = data.pop("context_id", None)
            try:
                if context_id is not None and not is_context_id(context_id):
                    raise invalid_context_id(context_id)
                self.speech, self.inputs = await session_inputs(data, self.app, self.config)
                break
            except ApiError as exc:
                await self.send_error(exc, context_id)
        if self.speech.inactivity_timeout is not None:
            self.idle.timeout_s, self.idle.flag = self.speech.inactivity_timeout, "inactivity_timeout"
        spec = self.speech.output
        await self.send_event({"type": "session.started", "session_id": self.session_id,
                               "response_format": spec.format.name, "sample_rate": spec.sample_rate,
                               "channels": spec.channels, "sample_format": "s16le"})
        if context_id is not None:
            await self.open_context(context_id, None)

    async def read_messages(self) -> None:
        """Every message after the options, routed by context_id; returns once the socket is closed."""
        while True:
            data = await self.receive()
            kind = data.get("type")
            if kind == "close_socket":
                await self.close_socket("close_socket")
                return
            if "context_id" not in data:
                if await self.on_default(kind, data):
                    return
                continue
            context_id = data.pop("context_id")
            if not is_context_id(context_id):
                await self.send_error(invalid_context_id(context_id), context_id)
            elif context_id in self.ended_ids:
                await self.send_error(context_ended(context_id, kind), context_id)
            else:
                await self.on_named(kind, context_id, data)

    # --- the default context: the one-context protocol --------------------------------------------

    async def on_default(self, kind, data: dict) -> bool:
        """One message of the one-context protocol; True once the socket is closed."""
        context = self.default
        if context is not None and context.is_ended and kind in ("text", "flush", "end"):
            await self.send_error(input_ended(kind))
        elif kind == "text":
            if not isinstance(data.get("text"), str):
                await self.send_error(errors.bad_request("text must be a string", "text"))
            elif (context := await self.use_default()) is not None:
                context.push_text(data["text"], self.config.ws_max_buffered_chars)
        elif kind in ("flush", "end"):
            if (context := await self.use_default()) is None:
                return False
            if kind == "flush":
                context.flush()
                return False
            await context.end()
            if context.is_over:  # nothing was said
                await self.close_socket("done")
                return True
        elif kind == "cancel":
            if context is not None:
                await context.cancel()
            else:
                await self.send_event({"type": "done", "cancelled": True, "segments": 0})
            await self.close_socket("cancelled")
            return True
        elif kind == "options":
            await self.send_error(errors.bad_request(
                "the options were set by the first message; name a context_id to open a context with its own "
                "options", "type"))
        else:
            await self.send_error(unknown_type(kind))
        return False

    async def use_default(self) -> Optional[SpeechContext]:
        if self.default is None:
            if self.num_open >= self.config.ws_max_contexts:
                await self.send_error(too_many_contexts(self.config.ws_max_contexts))
                return None
            self.default = SpeechContext(self, None, self.speech, self.inputs, self.context_over,
                                         session_id=self.session_id, finished=self.default_finished)
            await self.default.start()
        return self.default

    # --- named contexts ---------------------------------------------------------------------------

    async def on_named(self, kind, context_id: str, data: dict) -> None:
        context = self.contexts.get(context_id)
        if kind == "options":
            if context is not None:
                await self.send_error(context_exists(context_id), context_id)
            else:
                await self.open_context(context_id, data)
        elif kind == "text":
            if not isinstance(data.get("text"), str):
                await self.send_error(errors.bad_request("text must be a string", "text"), context_id)
            elif context is not None and context.is_ended:
                await self.send_error(input_ended(kind), context_id)
            elif context is not None or (context := await self.open_context(context_id, None)) is not None:
                context.push_text(data["text"], self.config.ws_max_buffered_chars)
        elif kind in ("flush", "end", "cancel"):
            if context is None:
                await self.send_error(unknown_context(context_id, kind), context_id)
            elif kind == "cancel":
                await context.cancel()
            elif context.is_ended:
                await self.send_error(input_ended(kind), context_id)
            elif kind == "flush":
                context.flush()
            else:
                await context.end()
        else:
            await self.send_error(unknown_type(kind), context_id)

    async def open_context(self, context_id: str, data: Optional[dict]) -> Optional[SpeechContext]:
        """A named context with its own options (`data`) or the socket's (None), announced by
        context.started; None (after an error event naming it) when it cannot open."""
        try:
            if self.num_open >= self.config.ws_max_contexts:
                raise too_many_contexts(self.config.ws_max_contexts)
            if self.app.state.heartbeat_problem is not None:
                raise errors.unavailable(f"the TTS server is unhealthy: {self.app.state.heartbeat_problem}")
            speech, inputs = ((self.speech, self.inputs) if data is None
                              else await context_inputs(data, self.speech, self.app, self.config))
        except ApiError as exc:
            await self.send_error(exc, context_id)
            return None
        context = SpeechContext(self, context_id, speech, inputs, self.context_over)
        self.contexts[context_id] = context
        await context.start()
        return context
