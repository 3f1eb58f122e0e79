"""Bridges a decoupled Triton model and the engine thread (the vllm_backend shape).

`execute` calls `submit` and returns at once; the engine thread only puts events on a queue;
one response thread drains it and talks to Triton (sending is IPC, and the engine must never
wait on it). Cancellation is polled once per chunk, on the response thread. Every request
gets exactly one final response, whatever happens. No Triton import: the adapter passes a
`Sender` per request.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from ..engine.engine import Engine
from ..engine.events import CodesChunk, EngineEvent, Finished
from ..engine.request import EngineRequest

log = logging.getLogger(__name__)


class Sender(Protocol):
    def send_codes(self, codes: torch.Tensor, context: Optional[torch.Tensor]) -> None: ...
    def send_final(self, error: Optional[str], code: str) -> None: ...  # code: ok|cancelled|internal|unavailable
    def is_cancelled(self) -> bool: ...


@dataclass
class _Stream:
    sender: Sender
    context: Optional[torch.Tensor]  # continuation prefix, sent once with the first chunk
    is_aborting: bool = False


class EngineFrontend:
    def __init__(self, engine_factory) -> None:
        """`engine_factory(on_event)` builds the Engine; the frontend owns its callback."""
        self._events: "queue.Queue[Optional[EngineEvent]]" = queue.Queue()
        self.engine: Engine = engine_factory(self._events.put)
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()  # guards _streams (execute thread vs response thread)
        self._idle = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._drain, name="moss-tts-responses", daemon=True)

    def start(self) -> None:
        self.engine.start()
        self._thread.start()

    def submit(self, request: EngineRequest, sender: Sender, context: Optional[torch.Tensor]) -> None:
        """Raises what Engine.submit raises (ValueError, QueueFull); nothing is registered then."""
        with self._lock:
            if request.request_id in self._streams:
                raise ValueError(f"request id {request.request_id!r} is already in flight; use a unique REQUEST_ID")
            self._streams[request.request_id] = _Stream(sender, context)
        try:
            self.engine.submit(request)
        except Exception:
            with self._lock:
                self._streams.pop(request.request_id, None)
            raise

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel what is left, deliver every final response, then stop both threads."""
        self.engine.shutdown(timeout)
        with self._idle:
            self._idle.wait_for(lambda: not self._streams, timeout)
        self._events.put(None)
        self._thread.join(timeout)

    # ---- response thread ----

    def _drain(self) -> None:
        while (event := self._events.get()) is not None:
            try:
                if isinstance(event, CodesChunk):
                    self._on_chunk(event)
                else:
                    self._on_finished(event)
            except Exception:  # a broken sender must not stop responses to everyone else
                log.exception("sending a response for request %s failed", event.request_id)

    def _on_chunk(self, event: CodesChunk) -> None:
        with self._lock:
            stream = self._streams.get(event.request_id)
        if stream is None or stream.is_aborting:
            return
        if stream.sender.is_cancelled():  # one IPC round trip per chunk, never per frame
            stream.is_aborting = True
            self.engine.abort(event.request_id)
            return
        context, stream.context = stream.context, None
        stream.sender.send_codes(event.codes, context)

    def _on_finished(self, event: Finished) -> None:
        with self._lock:
            stream = self._streams.pop(event.request_id, None)
        try:
            if stream is not None:
                stream.sender.send_final(*_final(event, stream))
        finally:
            with self._idle:
                self._idle.notify_all()


def _final(event: Finished, stream: _Stream) -> tuple[Optional[str], str]:
    if event.reason == "cancelled":
        return f"request {event.request_id} was cancelled", "cancelled"
    if event.reason == "error":
        return f"synthesis failed: {event.error}", "internal"
    if stream.context is not None and event.num_frames == 0:
        # A continuation that stopped at once still owes the client its context codes.
        stream.sender.send_codes(torch.zeros(0, stream.context.shape[1], dtype=torch.long), stream.context)
    return None, "ok"
