"""EngineCodes: the code chunks of one request from the in-process engine.

It builds the prompt rows (after the reference codes arrive), submits the request to
EngineStreams and turns the request's feed into stream_ports.CodesChunk values, with None
every `wait_s` seconds without news so the stream can check cancellation while it waits in the
engine's queue, and AUDIO_READY when `wake()` says a vocoder call of the stream completed (the
feed is the one queue the stream thread waits on). Engine refusals and failures become
ChildError with the error kind the client sees. Closing the iterator before the request
finished aborts it. No Triton import.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import numpy as np
import torch

from ..contract.errors import SHUTTING_DOWN, ChildError, ErrorKind, error_text
from ..contract.tensors import N_VQ
from ..engine.engine import EngineClosed
from ..engine.events import Finished
from ..engine.request import EngineRequest
from ..engine.scheduler import QueueFull
from ..model.processor import PromptBuilder, PromptError
from .engine_streams import EngineStreams
from .stream_ports import AUDIO_READY, NO_CODES, CodesChunk
from .synthesis_request import SynthesisRequest

WAIT_S = 1.0  # how often a waiting stream gets a chance to notice a cancel


class EngineCodes:
    def __init__(self, streams: EngineStreams, builder: PromptBuilder, synthesis: SynthesisRequest,
                 reference_codes: Callable[[], Optional[np.ndarray]], wait_s: float = WAIT_S) -> None:
        self.streams = streams
        self.builder = builder
        self.synthesis = synthesis
        self.reference_codes = reference_codes  # [frames, 12] or None; may raise ChildError
        self.wait_s = wait_s
        self._is_aborted = False
        self._feed = None
        self._is_woken = False  # a wake before the feed exists is delivered when it does
        # A ChunkForwarder the stream set before iterating chunks(): the engine's thread hands each
        # chunk to the vocoder through it. Not for a continuation: its context primes the vocoder
        # sequence on the stream's thread before the first chunk.
        self.forward = None

    def wake(self) -> None:
        """Any thread: the stream has audio to send; its wait for the next chunk ends now."""
        # Flag first, feed second (and chunks() the other way round): a wake that races the
        # feed's creation is delivered at least once.
        self._is_woken = True
        feed = self._feed
        if feed is not None:
            feed.put(AUDIO_READY)

    def abort(self) -> None:
        self._is_aborted = True
        self.streams.abort(self.synthesis.request_id)

    def chunks(self) -> Iterator[Optional[CodesChunk]]:
        reference = self.reference_codes()
        reference = None if reference is None or not reference.size else reference.reshape(-1, N_VQ).astype(np.int32)
        feed = self._feed = self._submit(reference)
        if self._is_woken:  # a call completed before the feed existed
            feed.put(AUDIO_READY)
        try:
            if self.synthesis.mode == "continuation" and reference is not None:
                yield CodesChunk(NO_CODES, reference)  # the context the audio continues from
            while True:
                event = feed.next(self.wait_s)
                if event is not None:  # the stream's work for it (a vocoder call, sends) waits its turn
                    self.streams.give_way()
                if event is None or event is AUDIO_READY:
                    yield event
                elif isinstance(event, Finished):
                    self._check(event)
                    return
                else:
                    yield CodesChunk(event.codes, NO_CODES, feed.queued_at, feed.first_codes_at)
        finally:
            if not feed.is_finished:
                self.abort()

    def _submit(self, reference: Optional[np.ndarray]):
        ref = None if reference is None else torch.from_numpy(reference.astype(np.int64))
        s = self.synthesis
        self.streams.give_way()  # tokenizing holds the GIL (Rust) for a while
        try:
            rows = self.builder.build(s.prompt_spec(ref))
            params = s.params_for(rows.shape[0], self.streams.max_seq_len)
            forward = None if s.mode == "continuation" and reference is not None else self.forward
            return self.streams.submit(EngineRequest(s.request_id, rows, params, s.first_chunk_frames,
                                                     s.chunk_frames), forward)
        except QueueFull as exc:
            raise ChildError(f"server busy: {exc}", ErrorKind.UNAVAILABLE) from None
        except EngineClosed:
            raise ChildError(SHUTTING_DOWN, ErrorKind.UNAVAILABLE) from None
        except (PromptError, ValueError) as exc:
            raise ChildError(error_text(exc), ErrorKind.INVALID_ARGUMENT) from None

    def _check(self, event: Finished) -> None:
        if event.reason == "error":
            raise ChildError(f"synthesis failed: {event.error}", ErrorKind.INTERNAL)
        if event.reason == "cancelled" and not self._is_aborted:
            raise ChildError("the engine stopped this request (shutting down); retry", ErrorKind.UNAVAILABLE)
