"""Chunk deadlines (EngineConfig.chunk_deadline_ms, engine/chunk_deadlines.py): a chunk leaves
before its size when one more step would make it leave later than the deadline before the audio
already sent plays out, and keeps its size once the engine has fallen behind. Driven through Engine._complete with a fake
clock: each step takes `step_s` of it."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine import CodesChunk, Engine, EngineConfig, EngineConfigError, EngineRequest
from moss_tts.engine import chunk_deadlines
from moss_tts.engine import request as request_module
from moss_tts.engine.request import RequestState
from perf.bench_engine_host import complete_step

FRAME_S = 0.08


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def chunks_over_time(tiny_model, monkeypatch, deadline_ms: int, step_s: float, frames: int = 60):
    """[(time it left, frames)] of one stream's chunks, the engine taking step_s a step."""
    clock = Clock()
    for module in (chunk_deadlines, request_module):  # where chunks are dated
        monkeypatch.setattr(module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    config = EngineConfig(max_running_requests=1, chunk_frames=25, chunk_deadline_ms=deadline_ms)
    left = []
    engine = Engine(tiny_model, config,
                    lambda e: left.append((clock.now, e.codes.shape[0])) if isinstance(e, CodesChunk) else None)
    state = RequestState.create(EngineRequest("r", torch.zeros((3, 13), dtype=torch.long),
                                              SamplingParams(seed=0, max_frames=frames + 10)), config)
    state.start(0)
    row = np.concatenate([np.ones((1, 1), np.int64), np.zeros((1, 12), np.int64)], axis=1)
    for _ in range(frames):
        clock.now += step_s
        complete_step(engine, row, [state])
    engine.host_turn.give()
    return left


def late_chunks(left) -> list[int]:
    """Indexes of the chunks that left after the audio sent before them had played out (the
    listener's clock starting as the first chunk left)."""
    start, sent = left[0][0], left[0][1]
    late = []
    for k, (at, n) in enumerate(left[1:], 1):
        if at > start + sent * FRAME_S + 1e-9:
            late.append(k)
        sent += n
    return late


def test_off_chunks_leave_at_their_sizes_and_run_dry_at_slow_steps(tiny_model, monkeypatch):
    left = chunks_over_time(tiny_model, monkeypatch, 0, 0.05)
    assert [n for _, n in left] == [2, 4, 8, 16, 25]
    assert late_chunks(left) == [1, 2, 3, 4]  # 4 frames in 200 ms against 160 ms of audio, and so on


def test_on_chunks_leave_by_their_deadlines_while_the_engine_outruns_real_time(tiny_model, monkeypatch):
    left = chunks_over_time(tiny_model, monkeypatch, 40, 0.05)
    assert late_chunks(left) == []
    start, sent = left[0][0], left[0][1]
    for at, n in left[1:]:  # each left at least 40 ms before the listener runs dry
        assert at <= start + sent * FRAME_S - 0.04 + 1e-9, left
        sent += n
    assert left[1][1] < 4  # the second chunk left before its 4 frames were in


def test_on_never_flushes_early_at_fast_steps(tiny_model, monkeypatch):
    assert ([n for _, n in chunks_over_time(tiny_model, monkeypatch, 40, 0.01)]
            == [n for _, n in chunks_over_time(tiny_model, monkeypatch, 0, 0.01)] == [2, 4, 8, 16, 25])


def test_behind_real_time_chunks_keep_their_sizes(tiny_model, monkeypatch):
    """An engine slower than real time: at most one early chunk, then the sizes (no fragments)."""
    off = chunks_over_time(tiny_model, monkeypatch, 0, 0.1)
    on = chunks_over_time(tiny_model, monkeypatch, 40, 0.1)
    assert len(on) <= len(off) + 1 and min(n for _, n in on[2:]) >= 4


def test_the_deadline_is_validated():
    with pytest.raises(EngineConfigError, match="chunk_deadline_ms"):
        EngineConfig(chunk_deadline_ms=-1)
