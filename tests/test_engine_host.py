"""The engine thread's per-step host work never gives the GIL up.

Under load ~256 stream threads, the vocoder worker and execute() want the GIL; every time the
engine thread gives it up it waits its turn to win it back. numpy gives it up inside copies:
chunks built row by row from numpy arrays (np.array of a list of row arrays) did so once per
frame delivered, half of the engine thread's time in the H200 soak's py-spy record (issue 34).
Here a thread that only counts while it holds the GIL runs beside the engine's completion of
steps; with a 1 s switch interval it can only run when that work gives the GIL up."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine import CodesChunk, Engine, EngineConfig, EngineRequest
from moss_tts.engine.engine import Launch
from moss_tts.engine.request import RequestState
from moss_tts.engine.runner import StepOutput
from moss_tts.engine.stats import GraphUse

import torch


class GilCounter:
    """A thread that counts while it holds the GIL: `count()` moves only if the GIL was given up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._count += 1

    def count(self) -> int:
        with self._lock:
            return self._count

    def __enter__(self) -> "GilCounter":
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(1.0)  # no forced hand-over within the test's few milliseconds
        self._thread.start()
        time.sleep(0.01)  # it runs; the caller wins the GIL back at the next voluntary release
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        sys.setswitchinterval(self._interval)
        self._thread.join(5)


def running_states(num: int, chunk_frames: int) -> list[RequestState]:
    rows = torch.zeros((3, 13), dtype=torch.long)
    states = []
    for i in range(num):
        request = EngineRequest(f"r{i}", rows, SamplingParams(seed=i, max_frames=1000), chunk_frames, chunk_frames)
        state = RequestState.create(request, EngineConfig())
        state.start(i)
        states.append(state)
    return states


def test_completing_steps_and_building_chunks_never_gives_the_gil_up(tiny_model):
    events, lock = [], threading.Lock()

    def sink(event) -> None:
        with lock:
            events.append(event)

    engine = Engine(tiny_model, EngineConfig(max_running_requests=32), sink)
    frames = 25
    states = running_states(32, frames)
    rng = np.random.default_rng(0)
    outputs = [np.concatenate([np.ones((32, 1), np.int64), rng.integers(0, 1024, (32, 12))], axis=1)
               for _ in range(frames)]
    launches = [Launch(StepOutput(rows, None, [], 0, GraphUse()), [], [(s, s.slot) for s in states])
                for rows in outputs]
    with GilCounter() as gil:
        before = gil.count()
        for launch in launches:
            engine._complete(launch)  # the last one builds 32 chunks of 25 frames
        released = gil.count() - before
    with lock:
        chunks = [e for e in events if isinstance(e, CodesChunk)]
    assert len(chunks) == 32 and all(c.codes.shape == (frames, 12) and c.codes.dtype == np.int32 for c in chunks)
    first = next(c for c in chunks if c.request_id == "r5")
    assert np.array_equal(first.codes, np.stack([rows[5, 1:] for rows in outputs]))
    assert released == 0, f"the engine's completion gave the GIL up ({released} counts of another thread)"
