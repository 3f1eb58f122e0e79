"""The engine thread's host work per step at N running rows, on the CPU (issue 34).

    PYTHONPATH=python_backends:. python3 perf/bench_engine_host.py [--rows 256] [--steps 200] [--out x.json]
    PYTHONPATH=python_backends:. python3 perf/bench_engine_host.py --admit 256 [--prompt-rows 48] [--reps 20]

Under the mixed soak the engine thread is host-bound: each step's Python runs while ~256 stream
threads want the GIL, and every time it gives the GIL up (a numpy copy, a torch call) or is made to
(each switch interval of Python), it waits its turn. This times the per-row part of a step with no
device work: `Engine._complete` of a step's output rows (frames, chunk building at the served
schedule 2, 4, 8, 16, 25 frames) plus the launch's per-row lists, on a tiny random model, and counts
the GIL hand-offs it makes (perf/gil_counter.py). Both figures are what a change to the engine's
bookkeeping should lower; the GPU and the real stub are not involved.

`--admit N`: the engine thread's work to admit a wave of N prompts instead (`admission`). At the
start of a 256-stream wave the H200's steps were host-bound (round 13's trace: 44 ms steps of 18 ms
GPU work; round 14's counters: 10-18 ms of host time a step while a wave was admitted, 3-4 between
waves), and part of that is per-prompt Python on the engine thread. N requests of one
`--prompt-rows`-row prompt (the bench's wave: one text, one voice, so after the first wave their
prefix blocks are in the pool) are submitted as Engine.submit does (the caller's thread:
check_fits, RequestState.create), then timed: what the engine thread does with them before any
device work (Engine._schedule: admission and prefix matching; Engine._stage; the step's cache plan;
the runner's prefill plan and input fill, unpinned here). Reported: the median over `--reps` waves,
for the wave and per prompt, and the caller's time per request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine import CodesChunk, Engine, EngineConfig, EngineRequest
from moss_tts.engine.launch import Launch
from moss_tts.engine.prefill_batch import prefill_plan
from moss_tts.engine.request import RequestState
from moss_tts.engine.runner import StepOutput
from moss_tts.engine.stats import GraphUse
from moss_tts.model.config import MossTTSConfig
from moss_tts.model.loading import build_random_model
from moss_tts.tools.make_tiny_checkpoint import tiny_model_config_dict
from perf.gil_counter import GilCounter


def running_states(num: int, first_chunk: int, chunk: int, max_frames: int = 1000,
                   config: EngineConfig = EngineConfig()) -> list[RequestState]:
    """`num` requests started in slots 0..num-1, as the scheduler leaves them."""
    rows = torch.zeros((3, 13), dtype=torch.long)
    states = []
    for i in range(num):
        request = EngineRequest(f"r{i}", rows, SamplingParams(seed=i, max_frames=max_frames), first_chunk, chunk)
        state = RequestState.create(request, config)
        state.start(i)
        states.append(state)
    return states


def complete_step(engine: Engine, rows: np.ndarray, decoding: list[RequestState]) -> None:
    """What the engine thread does with a finished decode step of `decoding` (output rows `rows`,
    row = slot; no prefill), as if launched: their frames added, their chunks built and emitted."""
    engine._complete(Launch(StepOutput(rows, None, [], 0, GraphUse()), [], [(s, s.slot) for s in decoding]))
    for s in decoding:
        s.num_issued += 1


def run(rows: int, steps: int, seed: int = 0, deadline_ms: int = 0) -> dict:
    model = build_random_model(MossTTSConfig.from_dict(tiny_model_config_dict(), "tiny"), "cpu", torch.float32, seed=0)
    chunks = []
    config = EngineConfig(max_running_requests=rows, chunk_deadline_ms=deadline_ms)
    engine = Engine(model, config, lambda e: chunks.append(isinstance(e, CodesChunk)))
    states = running_states(rows, 2, 25, max_frames=steps + 51, config=config)
    rng = np.random.default_rng(seed)
    outputs = [np.concatenate([np.ones((rows, 1), np.int64), rng.integers(0, 1024, (rows, 12))], axis=1)
               for _ in range(8)]
    # Staggered as in serving: request i joins at step i % 50 of a warm-up, so chunks fall due
    # on different steps (in lockstep every request's chunk would come at once).
    for k in range(50):
        complete_step(engine, outputs[k % len(outputs)], [s for s in states if s.slot % 50 <= k])
    chunks.clear()
    times, handoffs = [], 0
    with GilCounter() as gil:
        for k in range(steps):
            before, started = gil.count(), time.perf_counter()
            decoding = [s for s in states if s.is_running and s.can_issue]  # as Engine._launch selects
            complete_step(engine, outputs[k % len(outputs)], decoding)
            times.append(time.perf_counter() - started)
            handoffs += gil.count() != before
    return {"rows": rows, "steps": steps, "ms_per_step_mean": round(statistics.fmean(times) * 1e3, 3),
            "ms_per_step_median": round(statistics.median(times) * 1e3, 3), "chunks_per_step": round(sum(chunks) / steps, 2),
            "steps_that_gave_the_gil_up": handoffs}


SERVED_PREFILL_ROWS = 4096  # model_repository/moss_tts/config.pbtxt prefill_chunk_tokens


def engine_for(prompts: int) -> Engine:
    """A set-up tiny engine on the CPU with the served admission settings (prefix reuse on,
    4096 prefill rows a step), its thread never started: the caller plays the engine thread."""
    model = build_random_model(MossTTSConfig.from_dict(tiny_model_config_dict(), "tiny"), "cpu", torch.float32, seed=0)
    config = EngineConfig(max_running_requests=prompts, max_queue=prompts, prefill_chunk_tokens=SERVED_PREFILL_ROWS)
    engine = Engine(model, config, lambda event: None)
    engine._runner.setup()
    return engine


def admit_wave(engine: Engine, prompt: torch.Tensor, prompts: int, tag: str) -> tuple[float, float, int]:
    """Submit `prompts` requests of `prompt`, admit and stage them as one engine step does, then
    retire them. Returns (caller seconds, engine-thread seconds, prompts admitted)."""
    requests = [EngineRequest(f"{tag}-{i}", prompt, SamplingParams(seed=i, max_frames=112)) for i in range(prompts)]
    started = time.perf_counter()
    for request in requests:
        engine.submit(request)
    submitted = time.perf_counter()
    plan = engine._schedule()
    staged = [state for state in plan.admitted if engine._stage(state)]
    runner = engine._runner
    with engine._cond:
        engine._scheduler.cache.plan_step([(s.slot, s.prefix) for s in staged], [])
    _, groups = prefill_plan(runner._staged, engine.config.prefill_chunk_tokens)
    for _, group in groups:
        longest = max(p.rows.shape[0] - p.start for p in group)
        runner._inputs(group, len(group), longest)
    done = time.perf_counter()
    runner._staged.clear()
    with engine._cond:  # the admitted and any the step's budget left waiting (the first wave's)
        for state in engine._scheduler.live():
            engine._release(state, "cancelled")
    return submitted - started, done - submitted, len(plan.admitted)


def admission(prompts: int, rows: int, reps: int, seed: int = 0) -> dict:
    engine = engine_for(prompts)
    prompt = torch.from_numpy(np.random.default_rng(seed).integers(0, 100, (rows, 13)))
    admit_wave(engine, prompt, prompts, "first")  # the first wave fills the prefix pool, as in serving
    caller, engine_s, admitted = [], [], []
    for k in range(reps):
        c, e, n = admit_wave(engine, prompt, prompts, f"w{k}")
        caller.append(c)
        engine_s.append(e)
        admitted.append(n)
    wave_ms = statistics.median(engine_s) * 1e3
    return {"prompts": prompts, "prompt_rows": rows, "reps": reps, "admitted_per_wave": min(admitted),
            "engine_ms_per_wave_median": round(wave_ms, 3),
            "engine_us_per_prompt": round(wave_ms * 1e3 / min(admitted), 2),
            "caller_us_per_request": round(statistics.median(caller) * 1e6 / prompts, 2)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--chunk-deadline-ms", type=int, default=0, help="EngineConfig.chunk_deadline_ms of the run")
    p.add_argument("--admit", type=int, default=0, help="time the admission of a wave of this many prompts instead")
    p.add_argument("--prompt-rows", type=int, default=48)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out")
    args = p.parse_args(argv)
    result = (admission(args.admit, args.prompt_rows, args.reps) if args.admit
              else run(args.rows, args.steps, deadline_ms=args.chunk_deadline_ms))
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
