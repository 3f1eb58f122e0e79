"""An Engine's on_event sink for tests: events per request, first-chunk and finished signals,
and the codes a request received, checked for order."""

from __future__ import annotations

import threading

import numpy as np
import torch

from moss_tts.engine import CodesChunk, Finished
from shared_state import EventsByKey

TIMEOUT_S = 120  # generous: the CPU may be shared with other jobs


class Collector:
    """on_event sink: events per request, plus threading.Events for the first chunk and the end.
    The engine thread writes while the test reads: the events under the lock, the signals in
    EventsByKey (tests/shared_state.py)."""

    def __init__(self, on_first_chunk=None) -> None:
        self._events: dict[str, list] = {}
        self.first_chunk = EventsByKey()
        self.done = EventsByKey()
        self.on_first_chunk = on_first_chunk
        self._lock = threading.Lock()

    def __call__(self, event) -> None:
        with self._lock:
            self._events.setdefault(event.request_id, []).append(event)
        first_event, done = self.first_chunk[event.request_id], self.done[event.request_id]
        if isinstance(event, CodesChunk) and not first_event.is_set():
            first_event.set()
            if self.on_first_chunk is not None:
                self.on_first_chunk(event)
        if isinstance(event, Finished):
            done.set()

    def wait_finished(self, ids, timeout: float = TIMEOUT_S) -> None:
        for rid in ids:
            assert self.done[rid].wait(timeout), f"request {rid} never finished"

    def events(self, rid) -> list:
        """A copy of the request's events so far, in order."""
        with self._lock:
            return list(self._events.get(rid, ()))

    def chunks(self, rid) -> list[CodesChunk]:
        return [e for e in self.events(rid) if isinstance(e, CodesChunk)]

    def final(self, rid) -> Finished:
        """The request's single Finished event, checked to be its last event."""
        events = self.events(rid)
        finals = [e for e in events if isinstance(e, Finished)]
        assert len(finals) == 1, f"{rid}: {len(finals)} Finished events"
        assert events[-1] is finals[0], f"{rid}: Finished is not the last event"
        return finals[0]

    def codes(self, rid) -> torch.Tensor:
        chunks = self.chunks(rid)
        offsets = [c.frame_offset for c in chunks]
        assert offsets == [sum(c.num_frames for c in chunks[:i]) for i in range(len(chunks))], offsets
        return torch.from_numpy(np.concatenate([c.codes for c in chunks])).long() if chunks \
            else torch.zeros(0, 12, dtype=torch.long)


def assert_matches_reference(sink: Collector, rid: str, ref) -> None:
    final = sink.final(rid)
    codes = sink.codes(rid)
    assert final.reason == ref.finish_reason and final.error is None, (rid, final)
    assert final.num_frames == codes.shape[0] == ref.codes.shape[0], (rid, final, ref.codes.shape)
    assert torch.equal(codes, ref.codes), f"{rid}: codes differ from the reference loop"
