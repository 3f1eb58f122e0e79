"""One WebSocket to the server (WS /v1/audio/speech/stream), shared by every stream of a TTS.

Each stream is a named context on it (docs/websocket.md, "Contexts"): its messages carry its
context_id, and the server's events for it (context.started, audio, segment.done, done, error)
are routed to that context's queue. A context that is no longer routed (cancelled, its stream
gone) has its late events dropped here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp

from livekit.agents import APIConnectionError, APIStatusError, APITimeoutError, utils

from .log import logger

CLOSED = {"type": "connection.closed"}  # put in every routed queue when the socket goes away


class Connection:
    def __init__(self, session: aiohttp.ClientSession, url: str, options: dict[str, Any]) -> None:
        self._session, self._url, self._options = session, url, options
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._contexts: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        # Sends go through one queue and task so a stream being cancelled can still hand over its
        # `cancel` without awaiting, and messages keep the order they were queued in.
        self._outbox = utils.aio.Chan[dict[str, Any]]()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed or self._ws is None or self._ws.closed

    async def connect(self, timeout: float) -> None:
        """Open the socket and send the socket's options; returns once the server accepted them."""
        try:
            self._ws = await asyncio.wait_for(self._session.ws_connect(self._url), timeout)
            await self._ws.send_str(json.dumps({"type": "options", **self._options}))
            # The options are checked (a reference encoded) before the server answers.
            reply = await self._ws.receive(timeout=timeout)
        except asyncio.TimeoutError:
            await self.aclose()
            raise APITimeoutError("moss-tts: no answer to the socket's options") from None
        except aiohttp.WSServerHandshakeError as e:
            raise APIStatusError(f"moss-tts: {e.message}", status_code=e.status) from None
        except aiohttp.ClientError as e:
            await self.aclose()
            raise APIConnectionError(f"moss-tts: cannot connect to {self._url}") from e
        event = json.loads(reply.data) if reply.type == aiohttp.WSMsgType.TEXT else {}
        if event.get("type") != "session.started":
            await self.aclose()
            error = event.get("error") or {}
            raise APIStatusError(f"moss-tts rejected the options: {error.get('message', reply.data)}",
                                 status_code=event.get("status", -1), body=error)
        self._tasks = [asyncio.create_task(self._send_loop()), asyncio.create_task(self._recv_loop())]

    def open_context(self, context_id: str) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._contexts[context_id] = queue
        return queue

    def forget_context(self, context_id: str) -> None:
        self._contexts.pop(context_id, None)

    def send(self, message: dict[str, Any]) -> None:
        if self.closed:
            raise APIConnectionError("moss-tts: the socket is closed")
        self._outbox.send_nowait(message)

    async def aclose(self) -> None:
        """Close the socket as the protocol asks (`close_socket`: the server cancels every context
        still open on it, then closes)."""
        self._closed = True
        self._outbox.close()
        if self._ws is not None and not self._ws.closed:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await self._ws.send_str(json.dumps({"type": "close_socket"}))
            await self._ws.close()
        await utils.aio.cancel_and_wait(*self._tasks)
        self._end_contexts()

    async def _send_loop(self) -> None:
        try:
            async for message in self._outbox:
                await self._ws.send_str(json.dumps(message))
        except (aiohttp.ClientError, ConnectionError) as e:
            logger.warning("moss-tts: send failed: %s", e)
            await self._ws.close()

    async def _recv_loop(self) -> None:
        try:
            async for message in self._ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue  # binary frames are the unnamed context's, which no stream uses
                event = json.loads(message.data)
                queue = self._contexts.get(event.get("context_id", ""))
                if queue is not None:
                    queue.put_nowait(event)
                elif event.get("type") == "error" and "context_id" not in event:
                    logger.error("moss-tts: %s", event.get("error"))
        finally:
            self._closed = True
            self._outbox.close()
            self._end_contexts()

    def _end_contexts(self) -> None:
        for queue in self._contexts.values():
            queue.put_nowait(CLOSED)
        self._contexts.clear()

