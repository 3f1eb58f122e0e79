"""The engine thread's per-step host work never gives the GIL up.

Under load ~256 stream threads, the vocoder worker and execute() want the GIL; every time the
engine thread gives it up it waits its turn to win it back. numpy gives it up inside copies:
chunks built row by row from numpy arrays (np.array of a list of row arrays) did so once per
frame delivered, half of the engine thread's time in the H200 soak's py-spy record (issue 34).
Here a thread that only counts while it holds the GIL (perf/gil_counter.py) runs beside the
engine's completion of steps; with no forced switch it can only run when that work gives the GIL
up."""

from __future__ import annotations

import gc
import threading

import numpy as np
import torch

from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine import CodesChunk, Engine, EngineConfig, EngineRequest
from perf.bench_engine_host import complete_step, running_states
from perf.gil_counter import GilCounter


def test_completing_steps_and_building_chunks_never_gives_the_gil_up(tiny_model):
    events, lock = [], threading.Lock()

    def sink(event) -> None:
        with lock:
            events.append(event)

    engine = Engine(tiny_model, EngineConfig(max_running_requests=32), sink)
    frames = 25
    states = running_states(32, frames, frames)
    rng = np.random.default_rng(0)
    outputs = [np.concatenate([np.ones((32, 1), np.int64), rng.integers(0, 1024, (32, 12))], axis=1)
               for _ in range(frames)]
    # The collector off while it counts: a collection run by this code's allocations may finalize
    # another test's garbage (a file or socket closes with the GIL given up), which is not the
    # engine's doing (seen once in a full run: 2 hand-offs, never when the file runs alone).
    gc.collect()
    gc.disable()
    try:
        with GilCounter() as gil:
            before = gil.count()
            for rows in outputs:
                complete_step(engine, rows, states)  # the last one builds 32 chunks of 25 frames
            released = gil.count() - before
    finally:
        gc.enable()
    with lock:
        chunks = [e for e in events if isinstance(e, CodesChunk)]
    assert len(chunks) == 32 and all(c.codes.shape == (frames, 12) and c.codes.dtype == np.int32 for c in chunks)
    first = next(c for c in chunks if c.request_id == "r5")
    assert np.array_equal(first.codes, np.stack([rows[5, 1:] for rows in outputs]))
    assert released == 0, f"the engine's completion gave the GIL up ({released} counts of another thread)"


def test_the_host_bench_runs_staggered_requests_without_giving_the_gil_up():
    """perf/bench_engine_host.py, the CPU figure of the engine's per-row work a step (issue 34)."""
    from perf.bench_engine_host import run

    result = run(rows=64, steps=60)
    assert result["steps_that_gave_the_gil_up"] == 0
    assert 1 <= result["chunks_per_step"] < 64  # staggered: a few requests' chunks a step, not all at once
    assert result["ms_per_step_mean"] > 0


def test_an_admission_wave_hashes_and_converts_no_prompt_on_the_engine_thread(monkeypatch):
    """Engine.submit (the caller's thread) names a prompt's prefix blocks and converts its
    parameters; the engine's admission only looks them up (perf/bench_engine_host.py --admit: a wave of
    256 prompts took 4.9-5.2 ms of the engine thread on the dev box with that work there,
    3.1-3.7 without). The names must be the ones the pool stores, or the second wave reuses nothing."""
    from moss_tts.engine import prefill_batch, prefix_cache
    from perf.bench_engine_host import admit_wave, engine_for

    engine = engine_for(32)
    prompt = torch.from_numpy(np.random.default_rng(1).integers(0, 100, (48, 13)))
    assert admit_wave(engine, prompt, 32, "first")[2] == 32  # fills the pool: 2 blocks of 16 rows
    requests = [EngineRequest(f"r{i}", prompt, SamplingParams(seed=i, max_frames=8)) for i in range(32)]
    for request in requests:
        engine.submit(request)

    def on_the_engine_thread(*args, **kwargs):
        raise AssertionError("the engine thread computed what submit should have")

    monkeypatch.setattr(prefix_cache, "block_hashes", on_the_engine_thread)
    monkeypatch.setattr(prefill_batch, "param_rows", on_the_engine_thread)
    plan = engine._schedule()
    assert len(plan.admitted) == 32 and all(engine._stage(s) for s in plan.admitted)
    assert [s.prefix.reused_rows for s in plan.admitted] == [32] * 32  # the last block is prefilled
    staged = engine._runner._staged
    inputs = engine._runner._inputs(staged, len(staged), 16)
    _, _, _, _, ints, floats = inputs.arrays()
    monkeypatch.undo()
    expected = prefill_batch.prefill_inputs(
        [prefill_batch.StagedPrompt(p.slot, p.rows, p.params, p.prefix) for p in staged], len(staged), 16,
        engine._model_cfg, engine._runner.scratch_slot, pin=False).arrays()
    assert np.array_equal(ints, expected[4]) and np.array_equal(floats, expected[5])
    assert len({tuple(row) for row in ints}) == 32  # each prompt its own parameters (its seed)


def test_the_admission_bench_admits_a_whole_wave_in_one_step():
    from perf.bench_engine_host import admission

    result = admission(prompts=32, rows=48, reps=2)
    assert result["admitted_per_wave"] == 32 and result["engine_us_per_prompt"] > 0
