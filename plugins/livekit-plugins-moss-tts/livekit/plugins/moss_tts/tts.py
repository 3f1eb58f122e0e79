"""LiveKit Agents TTS for MOSS-TTS served by Triton, through the server's OpenAI-compatible shim.

`stream()`: the agent's LLM text goes, as it is written, into a named context of ONE WebSocket
that the TTS instance keeps open (connection.py); each stream is one context, so an interrupted
answer is cancelled on the server (`cancel`) while the next answer starts on the same socket at
once, without a new connection or a new reference encoding. The server cuts the text into
segments itself, so the text is passed on as it comes, no sentence tokenizer here.
`synthesize()`: POST /v1/audio/speech, raw pcm streamed back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from livekit.agents import APIConnectionError, APIConnectOptions, APIStatusError, APITimeoutError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS

from .connection import CLOSED, Connection

INPUT_ENDED = {"type": "input.ended"}  # the stream's own marker: no more text will come


@dataclass
class _Options:
    base_url: str
    voice: str | None
    sample_rate: int
    extra: dict[str, Any] = field(default_factory=dict)
    inactivity_timeout: float | None = None

    def speech(self) -> dict[str, Any]:
        """The fields of POST /v1/audio/speech that the WebSocket's options message takes too."""
        fields = {"response_format": "pcm", "sample_rate": self.sample_rate, "channels": 1, **self.extra}
        return fields | ({"voice": self.voice} if self.voice else {})

    def socket(self) -> dict[str, Any]:
        timeout = {"inactivity_timeout": self.inactivity_timeout} if self.inactivity_timeout else {}
        return self.speech() | timeout

    @property
    def ws_url(self) -> str:
        return self.base_url.replace("http", "ws", 1) + "/v1/audio/speech/stream"


class TTS(tts.TTS):
    def __init__(self, *, base_url: str = "http://localhost:8080", voice: str | None = None,
                 sample_rate: int = 24000, options: dict[str, Any] | None = None,
                 inactivity_timeout: float | None = 180.0,
                 http_session: aiohttp.ClientSession | None = None) -> None:
        """base_url: the shim (scripts/serve.sh's SHIM_PORT). voice: a saved voice of the server.
        sample_rate: of the pcm it sends (mono s16le), one of the shim's rates (24000 unless asked).
        options: further fields of the options message (docs/websocket.md), e.g. `seed`,
        `temperature`, `ref_audio`. inactivity_timeout: seconds the server keeps the idle socket
        open between answers (20-180; None: the server's --ws-idle-timeout); an idle socket that
        the server closed is reopened by the next stream."""
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True), sample_rate=sample_rate,
                         num_channels=1)
        self._opts = _Options(base_url.rstrip("/"), voice, sample_rate, dict(options or {}), inactivity_timeout)
        self._session = http_session
        self._connection: Connection | None = None
        self._connect_lock = asyncio.Lock()
        self._streams = weakref.WeakSet[SynthesizeStream]()
        self._prewarm_task: asyncio.Task[None] | None = None

    @property
    def model(self) -> str:
        return "moss-tts"

    @property
    def provider(self) -> str:
        return "moss-tts-triton"

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = utils.http_context.http_session()
        return self._session

    async def _shared_connection(self, timeout: float) -> tuple[Connection, bool]:
        """The TTS's socket, opened (again) if there is none or the server closed it."""
        async with self._connect_lock:
            if self._connection is not None and not self._connection.closed:
                return self._connection, True
            connection = Connection(self._ensure_session(), self._opts.ws_url, self._opts.socket())
            await connection.connect(timeout)
            self._connection = connection
            return connection, False

    def prewarm(self) -> None:
        """Open the socket before the first answer (the options, a reference too, checked by then)."""
        if self._prewarm_task is None or self._prewarm_task.done():
            self._prewarm_task = asyncio.create_task(self._prewarm())

    async def _prewarm(self) -> None:
        with contextlib.suppress(Exception):
            await self._shared_connection(DEFAULT_API_CONNECT_OPTIONS.timeout)

    def synthesize(self, text: str, *,
                   conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    async def aclose(self) -> None:
        if self._prewarm_task is not None:
            await utils.aio.cancel_and_wait(self._prewarm_task)
        for stream in list(self._streams):
            await stream.aclose()
        if self._connection is not None:
            await self._connection.aclose()
            self._connection = None


class ChunkedStream(tts.ChunkedStream):
    """One POST /v1/audio/speech, its pcm pushed on as it arrives."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        opts = self._tts._opts
        body = {"input": self._input_text, **opts.speech()}  # pcm streams unless "stream": false
        try:
            async with self._tts._ensure_session().post(
                    opts.base_url + "/v1/audio/speech", json=body,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._conn_options.timeout,
                                                  sock_read=self._conn_options.timeout)) as response:
                if response.status != 200:
                    raise APIStatusError(await response.text(), status_code=response.status)
                output_emitter.initialize(request_id=response.headers.get("X-Request-Id") or utils.shortuuid(),
                                          sample_rate=opts.sample_rate, num_channels=1, mime_type="audio/pcm")
                async for data, _ in response.content.iter_chunks():
                    output_emitter.push(data)
                output_emitter.flush()
        except asyncio.TimeoutError:
            raise APITimeoutError() from None
        except aiohttp.ClientError as e:
            raise APIConnectionError(f"moss-tts: {e}") from e


class SynthesizeStream(tts.SynthesizeStream):
    """One named context on the TTS's socket: text in as it is pushed, pcm out as it is spoken."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        context_id = utils.shortuuid("lk-")  # a new id per attempt: ids are not reused on a socket
        output_emitter.initialize(request_id=context_id, sample_rate=self._tts.sample_rate, num_channels=1,
                                  mime_type="audio/pcm", stream=True)
        output_emitter.start_segment(segment_id=context_id)
        connection, self._connection_reused = await self._tts._shared_connection(self._conn_options.timeout)
        events = connection.open_context(context_id)
        opened = finished = False

        async def send_input() -> None:
            nonlocal opened
            async for data in self._input_ch:
                if not isinstance(data, self._FlushSentinel):
                    connection.send({"type": "text", "context_id": context_id, "text": data})
                    opened = True  # the first text opens the context with the socket's options
                    self._mark_started()
                elif opened:
                    connection.send({"type": "flush", "context_id": context_id})
            if opened:
                connection.send({"type": "end", "context_id": context_id})
            events.put_nowait(INPUT_ENDED)

        input_task = asyncio.create_task(send_input())
        try:
            finished = await self._receive(events, output_emitter, input_task, lambda: opened)
        except APIStatusError:
            finished = True  # the server ended the context with its error event: nothing to cancel
            raise
        finally:
            connection.forget_context(context_id)
            await utils.aio.cancel_and_wait(input_task)
            if opened and not finished:  # interrupted (or failed): the server stops this context now
                with contextlib.suppress(APIConnectionError):
                    connection.send({"type": "cancel", "context_id": context_id})

    async def _receive(self, events: asyncio.Queue[dict[str, Any]], output_emitter: tts.AudioEmitter,
                       input_task: asyncio.Task[None], opened: Callable[[], bool]) -> bool:
        """Audio on to the emitter until the context's `done`; True once it came (or nothing was
        sent). While text may still come, audio may pause for as long as the LLM does."""
        while True:
            timeout = self._conn_options.timeout if input_task.done() else None
            try:
                event = await asyncio.wait_for(events.get(), timeout)
            except asyncio.TimeoutError:
                raise APITimeoutError("moss-tts: no audio within the timeout") from None
            kind = event["type"]
            if kind == "audio":
                output_emitter.push(base64.b64decode(event["audio"]))
            elif kind == "done":
                output_emitter.end_segment()
                return True
            elif kind == "input.ended" and not opened():
                output_emitter.end_segment()
                return True
            elif kind == "error":
                error = event.get("error") or {}
                raise APIStatusError(f"moss-tts: {error.get('message')}", status_code=event.get("status", -1),
                                     body=error)
            elif event is CLOSED:
                raise APIConnectionError("moss-tts: the socket closed before the context's done")
