"""EngineStreams: the engine behind one event queue per request (the `moss_tts` model's engine side).

The engine thread calls `on_event` and must never wait: each event is put on the queue of its
request (a `CodesFeed`) and nothing else happens on that thread. The request's stream thread
reads its feed, vocodes and sends; cancellation and shutdown are its business (it calls
`abort`). A feed ends with exactly one `Finished`. No Triton import.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Optional, Union

from ..engine.engine import Engine
from ..engine.events import CodesChunk, EngineEvent, Finished
from ..engine.request import EngineRequest


class CodesFeed:
    """The events of one request, in order: CodesChunk..., then one Finished."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        # SimpleQueue (C): a put is one call, a get waits on one lock. queue.Queue runs a
        # Condition in Python, lock hand-offs that each give the GIL up, on the engine thread at
        # every chunk and on the stream thread at every wake-up (10% of the GIL-holding samples
        # in the H200 soak's py-spy record, issue 34).
        self._events: "queue.SimpleQueue[EngineEvent]" = queue.SimpleQueue()
        self.is_finished = False  # set by the reader once it has taken the Finished
        # For the first-audio trace (first_audio_trace.py): when the request entered the engine's
        # queue, and when the engine put its first codes here (the engine thread's moment).
        self.queued_at = time.monotonic()
        self.first_codes_at = 0.0
        # A ChunkForwarder (chunk_forwarder.py) or None: called with each chunk on the delivering
        # (engine) thread; a chunk it takes never reaches the queue.
        self.forward: Optional[Callable[[CodesChunk], bool]] = None

    def put(self, event: EngineEvent) -> bool:
        """Queue `event`, or hand a chunk to the forwarder: True if the forwarder took it."""
        if isinstance(event, CodesChunk):
            if not self.first_codes_at:
                self.first_codes_at = time.monotonic()
            if self.forward is not None and self.forward(event):
                return True
        self._events.put(event)
        return False

    def next(self, timeout: float) -> Optional[Union[CodesChunk, Finished]]:
        """The next event, or None when nothing came within `timeout` seconds."""
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(event, Finished):
            self.is_finished = True
        return event


class EngineStreams:
    def __init__(self, engine_factory) -> None:
        """`engine_factory(on_event)` builds the Engine; this object owns its callback."""
        self.engine: Engine = engine_factory(self._route)
        self._feeds: dict[str, CodesFeed] = {}
        self._lock = threading.Lock()  # guards _feeds (stream threads vs the engine thread)
        self.chunks_forwarded = 0  # chunks the engine's thread handed to a vocoder (its thread alone writes it)

    def start(self) -> None:
        self.engine.start()

    def submit(self, request: EngineRequest, forward: Optional[Callable[[CodesChunk], bool]] = None) -> CodesFeed:
        """Raises what Engine.submit raises (ValueError, QueueFull, EngineClosed); nothing is
        registered then. `forward`: the feed's (CodesFeed.forward), set before any event can come."""
        feed = CodesFeed(request.request_id)
        feed.forward = forward
        with self._lock:
            if request.request_id in self._feeds:
                raise ValueError(f"request id {request.request_id!r} is already in flight; use a unique REQUEST_ID")
            self._feeds[request.request_id] = feed
        try:
            self.engine.submit(request)
        except Exception:
            with self._lock:
                self._feeds.pop(request.request_id, None)
            raise
        return feed

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def give_way(self) -> None:
        """A stream thread about to work: wait while the engine's host phase runs (host_turn.py)."""
        self.engine.host_turn.give_way()

    @property
    def max_seq_len(self) -> int:
        """KV rows per request: prompt rows + frames must fit."""
        return self.engine.config.max_seq_len

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._feeds)

    def stalled_seconds(self) -> float:
        return self.engine.stalled_seconds()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the engine; every request still in flight gets its Finished ("cancelled")."""
        self.engine.shutdown(timeout)

    def _route(self, event: EngineEvent) -> None:
        # Engine thread: a dict lookup and a queue put, never a wait.
        with self._lock:
            feed = self._feeds.get(event.request_id)
            if isinstance(event, Finished):
                self._feeds.pop(event.request_id, None)
        if feed is not None and feed.put(event):
            self.chunks_forwarded += 1
