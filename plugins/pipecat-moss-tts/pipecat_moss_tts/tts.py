"""Pipecat TTS service for MOSS-TTS served by Triton, through the server's OpenAI-compatible shim.

One WebSocket (WS /v1/audio/speech/stream) for the whole conversation; each turn is a named
context on it (Pipecat's turn context id is the server's context_id), so an interruption cancels
that context on the server (`cancel`) and the next turn opens a new one on the same socket at
once, without the reconnect that Pipecat's InterruptibleTTSService would do. The server cuts the
text into segments itself, so LLM tokens are passed on as they come (TOKEN aggregation) by default.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator
from typing import Any

from loguru import logger
from websockets.protocol import State

from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.utils.tracing.service_decorators import traced_tts

OPTIONS_TIMEOUT_S = 30.0  # a reference in the options is encoded before the server answers


class MossTTSService(WebsocketTTSService):
    """Streams each turn's text into one context of a shared socket; pcm s16le mono out."""

    def __init__(self, *, base_url: str = "http://localhost:8080", voice: str | None = None,
                 sample_rate: int | None = None, options: dict[str, Any] | None = None,
                 inactivity_timeout: float | None = 180.0,
                 text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN, **kwargs):
        """base_url: the shim (scripts/serve.sh's SHIM_PORT). voice: a saved voice of the server.
        sample_rate: of the pcm asked for (one of the shim's rates; None: the pipeline's output rate).
        options: further fields of the options message (docs/websocket.md), e.g. `seed`,
        `temperature`, `ref_audio`. inactivity_timeout: seconds the server keeps the idle socket
        open between turns (20-180; None: the server's --ws-idle-timeout)."""
        super().__init__(sample_rate=sample_rate, push_start_frame=True, text_aggregation_mode=text_aggregation_mode,
                         append_trailing_space=True,  # sentence mode only: sentences must not run together
                         settings=TTSSettings(model=None, voice=voice, language=None), **kwargs)
        self._url = base_url.rstrip("/").replace("http", "ws", 1) + "/v1/audio/speech/stream"
        self._options = dict(options or {})
        self._inactivity_timeout = inactivity_timeout
        self._receive_task: asyncio.Task | None = None
        # Contexts whose text reached the server and whose `done` has not come back: only these may
        # get `end` or `cancel` (the server answers an error for an unknown or an ended one).
        self._open_contexts: set[str] = set()

    def can_generate_metrics(self) -> bool:
        return True

    def _socket_options(self) -> dict[str, Any]:
        options = {"type": "options", "response_format": "pcm", "sample_rate": self.sample_rate, "channels": 1,
                   **self._options}
        if self._settings.voice:
            options["voice"] = self._settings.voice
        if self._inactivity_timeout:
            options["inactivity_timeout"] = self._inactivity_timeout
        return options

    async def setup(self, setup: FrameProcessorSetup):
        await super().setup(setup)  # the sample rate is known from here on
        await self._connect()

    async def _connect(self):
        await super()._connect()
        await self._connect_websocket()
        # A socket the server closed ends the receive task: a reopened one needs a new task.
        if self._websocket and (not self._receive_task or self._receive_task.done()):
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self):
        await super()._disconnect()
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self):
        if self._websocket and self._websocket.state is State.OPEN:
            return
        try:
            websocket = await self._websocket_connect(self._url)
            await websocket.send(json.dumps(self._socket_options()))
            reply = json.loads(await asyncio.wait_for(websocket.recv(), OPTIONS_TIMEOUT_S))
            if reply.get("type") != "session.started":
                await websocket.close()
                raise RuntimeError(f"the server rejected the options: {reply.get('error', reply)}")
            self._websocket = websocket
            self._open_contexts.clear()  # contexts live and die with their socket
            await self._call_event_handler("on_connected")
        except Exception as e:
            self._websocket = None
            await self.push_error(error_msg=f"{self} cannot connect to {self._url}: {e}", exception=e)
            await self._call_event_handler("on_connection_error", f"{e}")

    async def _disconnect_websocket(self):
        try:
            await self.stop_all_metrics()
            if self._websocket and self._websocket.state is State.OPEN:
                # As the protocol asks: the server cancels every context still open, then closes.
                await self._send({"type": "close_socket"})
            if self._websocket:
                await self._websocket.close()
        finally:
            self._websocket = None
            self._open_contexts.clear()
            await self._call_event_handler("on_disconnected")

    def _get_websocket(self):
        if self._websocket:
            return self._websocket
        raise Exception("Websocket not connected")

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._get_websocket().send(json.dumps(message))
        except Exception as e:
            logger.warning(f"{self} could not send {message['type']}: {e}")

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:
        changed = await super()._update_settings(delta)
        if "voice" in changed:  # the voice is the socket's option: a new socket carries the new one
            await self._disconnect()
            await self._connect()
        return changed

    async def flush_audio(self, context_id: str | None = None):
        """The turn's text is complete: `end` its context (the rest is spoken, then `done`)."""
        context_id = context_id or self.get_active_audio_context_id()
        if context_id in self._open_contexts:
            await self._send({"type": "end", "context_id": context_id})

    async def on_audio_context_interrupted(self, context_id: str):
        """The user interrupted: the server stops this context's generation now."""
        await self.stop_all_metrics()
        if context_id in self._open_contexts:
            await self._send({"type": "cancel", "context_id": context_id})
        await super().on_audio_context_interrupted(context_id)

    async def _receive_messages(self):
        async for message in self._get_websocket():
            if isinstance(message, bytes):
                continue  # binary frames are the unnamed context's, which this service never uses
            event = json.loads(message)
            kind, context_id = event.get("type"), event.get("context_id")
            if kind in ("done", "error"):
                self._open_contexts.discard(context_id)
            if not context_id or not self.audio_context_available(context_id):
                if kind == "error" and not context_id:
                    await self.push_error(error_msg=f"{self}: {event.get('error')}")
                continue  # late events of an interrupted context are dropped here
            if kind == "audio":
                await self.stop_ttfb_metrics()
                audio = base64.b64decode(event["audio"])
                frame = TTSAudioRawFrame(audio, self.sample_rate, 1, context_id=context_id)
                await self.append_to_audio_context(context_id, frame)
            elif kind in ("done", "error"):
                if kind == "error":
                    await self.push_error(error_msg=f"{self}: context {context_id}: {event.get('error')}")
                await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
                await self.remove_audio_context(context_id)

    @traced_tts
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send a piece of the turn's text into the turn's context (the first opens it); the audio
        comes through _receive_messages."""
        if not self._websocket or self._websocket.state is State.CLOSED:
            await self._connect()
        try:
            await self._get_websocket().send(json.dumps({"type": "text", "context_id": context_id, "text": text}))
            self._open_contexts.add(context_id)
            await self.start_tts_usage_metrics(text)
        except Exception as e:
            yield ErrorFrame(error=f"{self} could not send text: {e}")
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None
