"""A transparent WebSocket proxy in front of the shim's WS /v1/audio/speech/stream that timestamps
what crosses it (scripts/agent_turns.py): which sockets a plugin opens, each context's messages in
both directions, and how much audio the server sent for a context after its `cancel` went by.
The plugins only see another base_url."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

WS_PATH = "/v1/audio/speech/stream"


@dataclass
class Message:
    at: float  # time.perf_counter() when the proxy passed it on
    socket: int  # which connection through the proxy, from 1
    sender: str  # "client" or "server"
    type: str
    context_id: str = ""
    audio_s: float = 0.0  # a server audio event's length
    cancelled: bool = False  # a done that says so


class LocalProxy:
    """An aiohttp app on a free local port in front of the shim, with a client session to reach it;
    a subclass adds its routes (this recorder; check_agents.RecordingProxy for HTTP)."""

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> str:
        """The base URL the frameworks are given."""
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        self.add_routes(app)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()


class WsRecorder(LocalProxy):
    def __init__(self, shim_url: str):
        self.upstream = shim_url.rstrip("/").replace("http", "ws", 1) + WS_PATH
        self.messages: list[Message] = []
        self.sockets = 0

    def reset(self) -> None:
        self.messages, self.sockets = [], 0

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(WS_PATH, self._relay)

    async def _relay(self, request: web.Request) -> web.WebSocketResponse:
        self.sockets += 1
        socket, bytes_per_s = self.sockets, [24000 * 2]
        client = web.WebSocketResponse(max_msg_size=0)
        await client.prepare(request)
        async with self._session.ws_connect(self.upstream, max_msg_size=0) as server:
            async def pass_on(source, sink, sender: str) -> None:
                async for message in source:
                    if message.type == aiohttp.WSMsgType.TEXT:
                        self._record(socket, sender, json.loads(message.data), bytes_per_s)
                        await sink.send_str(message.data)
                    elif message.type == aiohttp.WSMsgType.BINARY:
                        await sink.send_bytes(message.data)

            up = asyncio.create_task(pass_on(client, server, "client"))
            down = asyncio.create_task(pass_on(server, client, "server"))
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            # One side closed: so does the other (a client gone cancels its contexts on the server).
            await client.close(code=server.close_code or aiohttp.WSCloseCode.OK)
            await server.close()
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
        return client

    def _record(self, socket: int, sender: str, event: dict, bytes_per_s: list) -> None:
        if sender == "client" and event.get("type", "options") == "options" and "context_id" not in event:
            bytes_per_s[0] = (event.get("sample_rate") or 24000) * (event.get("channels") or 1) * 2
        audio = len(base64.b64decode(event["audio"])) / bytes_per_s[0] if event.get("type") == "audio" else 0.0
        self.messages.append(Message(time.perf_counter(), socket, sender, event.get("type", "options"),
                                     event.get("context_id", ""), audio, bool(event.get("cancelled"))))

    def context_ids(self) -> list[str]:
        """The contexts the client opened, in order."""
        seen: list[str] = []
        for m in self.messages:
            if m.sender == "client" and m.context_id and m.context_id not in seen:
                seen.append(m.context_id)
        return seen

    def of(self, context_id: str, sender: str, kind: str) -> list[Message]:
        return [m for m in self.messages if m.context_id == context_id and m.sender == sender and m.type == kind]
