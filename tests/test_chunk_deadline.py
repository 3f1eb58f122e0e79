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


def chunks_over_time(tiny_model, monkeypatch, deadline_ms: int, step_s, frames: int = 60):
    """[(time it left, frames)] of one stream's chunks, the engine taking step_s a step (or the
    steps of the list step_s, its last one repeated)."""
    steps = list(step_s) if isinstance(step_s, (list, tuple)) else [step_s]
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
    for k in range(frames):
        clock.now += steps[min(k, len(steps) - 1)]
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


def test_on_a_wave_start_chunks_leave_by_their_deadlines(tiny_model, monkeypatch):
    """Ten 50 ms steps (a wave being admitted), then 15 ms ones: off, the second chunk runs dry;
    on, every chunk leaves at least the deadline before the listener's audio runs out."""
    steps = [0.05] * 10 + [0.015]
    assert late_chunks(chunks_over_time(tiny_model, monkeypatch, 0, steps)) == [1]
    left = chunks_over_time(tiny_model, monkeypatch, 40, steps)
    assert late_chunks(left) == [] and left[1][1] < 4, left
    start, sent = left[0][0], left[0][1]
    for at, n in left[1:]:
        assert at <= start + sent * FRAME_S - 0.04 + 1e-9, left
        sent += n


def test_sustained_slow_steps_get_three_early_chunks_then_the_sizes(tiny_model, monkeypatch):
    """50 ms steps throughout: the second to fourth chunks leave early and in time; then the
    sizes rule (chunk_target assumes steps under 40 ms), as with deadlines off."""
    left = chunks_over_time(tiny_model, monkeypatch, 40, 0.05)
    assert min(late_chunks(left)) > chunk_deadlines.MAX_EARLY_CHUNKS and left[1][1] < 4, left


def test_on_never_flushes_early_at_fast_steps(tiny_model, monkeypatch):
    assert ([n for _, n in chunks_over_time(tiny_model, monkeypatch, 40, 0.01)]
            == [n for _, n in chunks_over_time(tiny_model, monkeypatch, 0, 0.01)] == [2, 4, 8, 16, 25])


def test_a_step_longer_than_the_last_still_sends_before_the_audio_runs_out(tiny_model, monkeypatch):
    """30 ms steps, then two of 70 ms: the first of them ends past the deadline with the listener
    still playing (its audio runs out 160 ms after the first chunk, which left at 60 ms), and what
    the stream has leaves then, not at its size after the audio ran out."""
    steps = [0.03] * 4 + [0.07, 0.07, 0.015]
    left = chunks_over_time(tiny_model, monkeypatch, 40, steps)
    assert late_chunks(left) == [] and left[1][1] < 4, left
    assert late_chunks(chunks_over_time(tiny_model, monkeypatch, 0, steps)) == [1]


@pytest.mark.parametrize("step_s", [0.079, 0.081, 0.13])
def test_near_or_behind_real_time_at_most_three_chunks_leave_early(tiny_model, monkeypatch, step_s):
    """An engine near or behind real time: the deadline would fire nearly every step (one frame a
    chunk); at most MAX_EARLY_CHUNKS leave early, then the sizes rule."""
    off = chunks_over_time(tiny_model, monkeypatch, 0, step_s)
    on = chunks_over_time(tiny_model, monkeypatch, 40, step_s)
    assert len(on) <= len(off) + chunk_deadlines.MAX_EARLY_CHUNKS, (off, on)


def test_the_deadline_is_validated():
    with pytest.raises(EngineConfigError, match="chunk_deadline_ms"):
        EngineConfig(chunk_deadline_ms=-1)
