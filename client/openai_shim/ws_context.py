"""SpeechContext: one text session of a WebSocket (docs/websocket.md): one voice, one gRPC stream,
one continuous audio stream.

The text is cut by moss_tts.contract.text_segments.TextSegmenter here; each segment is one request
on the context's ONE gRPC stream to `moss_tts`, all naming its SESSION_ID (SessionRequests), the
last carrying SESSION_END. The stream opens when the context starts (`start`), before its first
segment is complete; a forwarder task then sends the audio as the responses arrive. The default context (no context_id, today's protocol) sends
audio as binary frames; a named one as JSON `audio` events carrying its id, since a binary frame
cannot name a context.

A context ends exactly once (`is_over`): done after its last segment, cancelled, failed, or its
socket gone. Ending frees everything it holds at once (the audio converter closed, the forwarder
stopped) and tells the connection (`on_over`), which counts it out of the socket's limit. Its
requests still running on the server are ended by in-band STOPs on the same call, one per request
(triton_stream.py, "Stopping an utterance early" in the README), then the call is half-closed and
read to its status, on a task of its own (`_end_call`); the call is cancelled only when the STOPs
are not answered within STOP_WAIT_S. The call is read by a CallReader, never by the forwarder
itself: grpc.aio cancels the RPC when a read is cancelled. A cancel stops the forwarder before the
cancelled `done` leaves, so no audio of the context follows its done.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from typing import Callable, Optional

import grpc

from moss_tts.contract import tensors as contract
from moss_tts.contract.session_requests import SessionRequests
from moss_tts.contract.text_segments import TextSegmenter

from . import errors
from .audio_format import seconds
from .audio_output import NO_AUDIO, AudioOutput
from .errors import ApiError
from .call_reader import ENDINGS, CallEnded, CallReader, keep, queued_requests
from .session_options import SessionOptions
from .triton_stream import AUDIO_ONLY, END_TIMEOUT_S, STOP_WAIT_S, build_inputs, stop_request
from .ws_protocol import POLICY, SOCKET_GONE, ProtocolViolation, error_event

log = logging.getLogger("openai_shim")


class SpeechContext:
    def __init__(self, connection, context_id: Optional[str], speech: SessionOptions, inputs: dict,
                 on_over: Callable[["SpeechContext"], None], session_id: Optional[str] = None,
                 finished: Optional[asyncio.Event] = None):
        self.connection = connection  # its send_event / send_bytes / app / config
        self.context_id = context_id  # None: the default context
        self.session_id = session_id or uuid.uuid4().hex
        self.segmenter = TextSegmenter()
        self.plan = SessionRequests(inputs)
        self.output = AudioOutput(speech.output)  # one stream: the segments join without a seam
        self.on_over = on_over  # the connection's bookkeeping, called once, when the context ends
        self.finished = finished
        self.requests: asyncio.Queue = asyncio.Queue()
        self.call = None
        self.reader: Optional[CallReader] = None
        self.sent_ids: list[str] = []  # the requests sent on the call, in order
        self.forwarder: Optional[asyncio.Task] = None
        self.failure: Optional[ApiError] = None  # why it failed, once it has
        self.is_ended = False  # the client sent `end`
        self.is_server_done = False  # the server ended the call: never cancel it (triton_stream.py)
        self.is_over = False

    @property
    def segments(self) -> list[str]:
        return self.plan.segments

    @property
    def is_speaking_after_end(self) -> bool:
        """Input ended, audio still coming: the idle timeout waits for it (the audio's turn)."""
        return self.is_ended and not self.is_over

    # --- sending ----------------------------------------------------------------------------------

    async def emit(self, event: dict) -> None:
        if self.context_id is not None:
            event = {"type": event["type"], "context_id": self.context_id, **event}
        await self.connection.send_event(event)

    async def emit_audio(self, data: bytes) -> None:
        if self.context_id is None:
            await self.connection.send_bytes(data)
        else:
            await self.connection.send_event({"type": "audio", "context_id": self.context_id,
                                              "audio": base64.b64encode(data).decode("ascii")})

    async def start(self) -> None:
        """The gRPC stream, context.started (named), then the wav header of unknown length (as the
        HTTP stream's). The stream opens here, before any text is complete, not with the first
        request: 128 sessions completing their first sentence at once would each open a stream in
        that instant, on the shim and on tritonserver's gRPC front end, before its request goes."""
        self.call = self.connection.app.state.triton.stream(queued_requests(self.requests))
        self.reader = CallReader(self.call)
        self.forwarder = asyncio.ensure_future(self._forward())
        if self.context_id is not None:
            await self.emit({"type": "context.started", "session_id": self.session_id})
        if self.output.spec.format.name == "wav":
            await self.emit_audio(self.output.push(NO_AUDIO))

    # --- client messages --------------------------------------------------------------------------

    def push_text(self, text: str, max_buffered_chars: int) -> None:
        if len(self.segmenter.buffered) + len(text) > max_buffered_chars:
            raise ProtocolViolation(POLICY, f"more than {max_buffered_chars} characters of text not yet spoken "
                                            f"(--ws-max-buffered-chars)")
        self.send_segments(self.segmenter.push(text))

    def flush(self) -> None:
        self.send_segments(self.segmenter.flush())

    async def end(self) -> None:
        """The rest is spoken, then done; nothing said at all: done at once, no request sent."""
        self.is_ended = True
        if not self.segments and not self.segmenter.buffered.strip():
            self.is_server_done = True
            self._free()
            await self.emit({"type": "done", "segments": 0, "frames": 0})
            return
        self.send_segments(self.segmenter.end(), is_end=True)

    async def cancel(self, send_done: bool = True) -> None:
        """Stop now: the server frees the session; then the cancelled done (unless the socket is gone)."""
        if self.is_over:
            return
        self._free()
        if self.forwarder is not None:
            await asyncio.wait({self.forwarder})  # cancelled by _free: its last audio is out or dropped
        if send_done:
            await self.emit({"type": "done", "cancelled": True, "segments": len(self.segments)})

    def send_segments(self, texts: list[str], is_end: bool = False) -> None:
        for i, text in enumerate(texts):
            self.request(text, is_end and i == len(texts) - 1)
        if is_end and not texts:
            self.request("", True)

    def request(self, text: str, is_end: bool) -> None:
        # plan.end_id is set before the send: the closing request's final may come back at once.
        request_id, options = self.plan.next(text, is_end)
        values = {"TEXT": text, **options, "SESSION_ID": self.session_id, "SESSION_END": True if is_end else None}
        app = self.connection.app
        self.sent_ids.append(request_id)
        self.requests.put_nowait({"model_name": app.state.triton.model, "inputs": build_inputs(values),
                                  "request_id": request_id, "outputs": AUDIO_ONLY,
                                  "parameters": {"triton_enable_empty_final_response": True}})

    # --- ending -----------------------------------------------------------------------------------

    def _free(self) -> None:
        """Free everything now; every way out calls it first, once (before its last event goes)."""
        self.is_over = True
        if self.call is not None:  # its requests still running are stopped, then it is half-closed
            running = [] if self.is_server_done else [i for i in self.sent_ids if i not in self.reader.final_ids]
            keep(asyncio.ensure_future(self._end_call(running)), ENDINGS)
        else:
            self.requests.put_nowait(None)
        if self.forwarder is not None and self.forwarder is not asyncio.current_task():
            self.forwarder.cancel()
        self.output.close()
        self.on_over(self)

    async def _end_call(self, running: list[str]) -> None:
        """STOP each request in `running` (those without a final flag read: one that ended by an error
        is stopped again, harmlessly), wait for every request's final and the STOPs' own (counted by
        the reader), half-close, read the call to its status; a gRPC cancel only when the server does
        not answer in time."""
        model = self.connection.app.state.triton.model
        for request_id in running:
            self.requests.put_nowait(stop_request(model, request_id))
        stopped = not running or await self.reader.until_finals(len(self.sent_ids) + len(running), STOP_WAIT_S)
        self.requests.put_nowait(None)
        if (not stopped and not self.reader.is_ended) or not await self.reader.until_status(END_TIMEOUT_S):
            self.call.cancel()

    async def _forward(self) -> None:
        """The forwarder task: audio until done; a failure ends this context with its error event.
        `finished` is set once its done or error event has left (the default context's end closes
        the socket then)."""
        try:
            await self._forward_audio()
        except ApiError as exc:
            await self._fail(exc)
        except asyncio.CancelledError:
            if not self.is_over:
                self._free()
            raise
        except SOCKET_GONE:  # the connection's own teardown cancels what is left
            if not self.is_over:
                self._free()
            return
        except Exception as exc:  # a bug: this context ends, the socket and its other contexts go on
            log.exception("WebSocket context %s failed", self.context_id)
            await self._fail(errors.internal(f"unexpected {type(exc).__name__}"))
        if self.finished is not None:
            self.finished.set()

    async def _fail(self, exc: ApiError) -> None:
        self.failure = exc
        self._free()
        try:
            await self.emit(error_event(exc))
        except SOCKET_GONE:
            pass

    async def _next_result(self):
        try:
            result, error = await self.reader.next(self.connection.config.response_timeout_s)
        except TimeoutError:
            raise errors.timeout(f"tritonserver sent nothing for {self.connection.config.response_timeout_s:g} s "
                                 f"(--response-timeout); the session was stopped") from None
        except CallEnded as ended:
            self.is_server_done = True
            if isinstance(ended.cause, grpc.aio.AioRpcError):
                raise errors.from_grpc(ended.cause) from None
            raise errors.internal("tritonserver closed the stream without a final response") from None
        return result, error

    async def _forward_audio(self) -> None:
        """Audio, a segment.done after each segment (where it starts and ends in this context's audio,
        exact from frames), done after the last."""
        frames, total = 0, 0
        while True:
            result, error = await self._next_result()
            if error is not None:
                self.is_server_done = True
                raise errors.from_triton_message(error.message())
            response = result.get_response()
            audio = result.as_numpy("AUDIO")
            if audio is not None and audio.size:
                frames += audio.shape[1] // contract.SAMPLES_PER_FRAME
                if data := self.output.push(audio):
                    await self.emit_audio(data)
            if not response.parameters["triton_final_response"].bool_param:
                continue
            index = self.plan.segment_of(response.id)
            if index is not None:
                await self.emit({"type": "segment.done", "index": index, "text": self.segments[index],
                                 "frames": frames, "start_s": seconds(total), "end_s": seconds(total + frames)})
                total, frames = total + frames, 0
            if response.id == self.plan.end_id:
                self.is_server_done = True
                tail = self.output.finish()  # the resampler's last milliseconds
                self._free()
                if tail:
                    await self.emit_audio(tail)
                await self.emit({"type": "done", "segments": len(self.segments), "frames": total})
                return
