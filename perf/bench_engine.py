"""Engine benchmark: real-size MOSS-TTS-Local (random weights, bf16) on one GPU, in-process.

    PYTHONPATH=python_backends python3 perf/bench_engine.py --out DIR     # GPU, ~5 min
    PYTHONPATH=python_backends python3 perf/bench_engine.py --tiny        # CPU smoke of the script

Every request ignores the stop head and runs a fixed number of frames (112 = 8.96 s of audio),
prompts are 150 random text rows. Sections, in order, each also written to DIR/bench.json:
  equivalence  graphed engine vs eager engine (same padded shapes: must be identical) and vs the
               reference loop generation.generate (bf16: agreement reported, not asserted)
  offline      whole-engine throughput at batch 1..256 (submit all, wait for all; prefill included)
  step         one decode step by graph replay per batch (steady state, no prefill)
  latency      submit -> first 2 frames / first 5 frames at concurrency 1 and 64
  naive        the eager reference loop at batch 1 and 16, same prompts and frames
  probe        host launch time and total time of eager batched prefills (16, 37, 54 prompts)
  split        one step at batch 1 and 256: backbone vs local frame, fused vs unfused kernels
  fp32         a float32 copy of the model: graphed engine (unfused kernels) vs generation.generate
  prefix       prompts of one speaker: a shared prefix of --shared-rows rows + unique rows; the pool
               is warmed by one request, then offline throughput at the largest batch and latency
               at concurrency 1 (reused prefix: only the rest is prefilled)
  profile      kernel time by name of one eager decode step at the largest batch (torch.profiler),
               written to DIR/profile.txt
The table is printed last.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from moss_tts.contract.sampling_params import ChannelParams, SamplingParams
from moss_tts.engine import CodesChunk, Engine, EngineConfig, EngineRequest, Finished, backbone, frame, step
from moss_tts.engine.slot_state import param_rows
from moss_tts.kernels import decode_attention, fused, kv_format
from moss_tts.kernels.fused import Fusions
from moss_tts.kernels.graph_capture import capture_graph
from moss_tts.model.config import MossTTSConfig, real_model_config_dict
from moss_tts.model.generation import generate
from moss_tts.model.loading import build_random_model
from moss_tts.tools.random_inputs import random_prompt_rows

FRAME_RATE = 12.5  # frames per second of audio
TIMEOUT_S = 300


# ---- inputs ----

def fixed_length(seed: int, frames: int) -> SamplingParams:
    return SamplingParams(seed=seed, max_frames=frames, ignore_stop=True)


def mixed_requests(frames: int, prompt_rows: int):
    """8 requests of mixed prompt lengths and sampling kinds (greedy, seeded, filtered +
    penalised, stop head live), half admitted while the others run."""
    lengths = [max(2, prompt_rows * n // 150) for n in (150, 90, 200, 60, 150, 120, 30, 170)]
    kinds = [SamplingParams.greedy(max_frames=frames, ignore_stop=True),
             SamplingParams(seed=11, max_frames=frames, ignore_stop=True),
             SamplingParams(seed=12, max_frames=frames - 8, ignore_stop=True,
                            audio=ChannelParams(1.0, 0.95, 50, 1.3)),
             SamplingParams(seed=13, max_frames=frames)]
    params = kinds + [replace(p, row_seed=p.row_seed + 1) for p in kinds]
    return [random_prompt_rows(n, 100 + i) for i, n in enumerate(lengths)], params


# ---- engine harness ----

class Sink:
    """on_event: per request the times of its chunks and its codes; an Event when all finish."""

    def __init__(self, expected: int) -> None:
        self.submitted: dict[str, float] = {}
        self.chunk_times: dict[str, list[tuple[float, int]]] = {}
        self.codes: dict[str, list[torch.Tensor]] = {}
        self.finals: dict[str, Finished] = {}
        self.expected, self.all_done = expected, threading.Event()
        self.on_chunk = self.on_finish = None

    def __call__(self, event) -> None:
        now = time.perf_counter()
        rid = event.request_id
        if isinstance(event, CodesChunk):
            self.chunk_times.setdefault(rid, []).append((now, event.frame_offset + event.num_frames))
            self.codes.setdefault(rid, []).append(torch.from_numpy(event.codes).long())
            if self.on_chunk is not None:
                self.on_chunk(event)
        elif isinstance(event, Finished):
            self.finals[rid] = event
            if self.on_finish is not None:
                self.on_finish(event)
            if len(self.finals) == self.expected:
                self.all_done.set()

    def all_codes(self, rid: str) -> torch.Tensor:
        return torch.cat(self.codes.get(rid, [torch.zeros(0, 12, dtype=torch.long)]))

    def time_to(self, rid: str, frames: int) -> float:
        return next(t for t, n in self.chunk_times[rid] if n >= frames) - self.submitted[rid]


def run_requests(engine: Engine, sink: Sink, prompts, params, prefix: str, **chunking) -> float:
    """Submit all at once, wait for all; returns wall seconds."""
    start = time.perf_counter()
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        rid = f"{prefix}{i}"
        sink.submitted[rid] = time.perf_counter()
        engine.submit(EngineRequest(rid, prompt, p, **chunking))
    assert sink.all_done.wait(TIMEOUT_S), f"{prefix}: requests did not finish"
    return time.perf_counter() - start


class Bench:
    def __init__(self, model, config: EngineConfig, frames: int, prompt_rows: int) -> None:
        self.model, self.config, self.frames, self.prompt_rows = model, config, frames, prompt_rows
        self.sink = Sink(0)
        start = time.perf_counter()
        self.engine = Engine(model, config, self._dispatch)
        self.engine.start()
        self.setup_s = time.perf_counter() - start

    def _dispatch(self, event) -> None:
        self.sink(event)

    def batch(self, prompts, params, prefix: str, **chunking) -> tuple[float, Sink]:
        self.sink = Sink(len(prompts))
        return run_requests(self.engine, self.sink, prompts, params, prefix, **chunking), self.sink

    def close(self) -> None:
        self.engine.shutdown(TIMEOUT_S)


# ---- sections ----

def equivalence(model, graphed: Bench, frames: int) -> dict:
    prompts, params = mixed_requests(frames, graphed.prompt_rows)
    eager = Bench(model, replace(graphed.config, enforce_eager=True), frames, 0)
    results = {}
    for name, bench in (("graphed", graphed), ("eager", eager)):
        results[name] = _staggered(bench, prompts, params)
    eager.close()
    reference = generate(model, prompts, params)
    identical = [torch.equal(results["graphed"][i], results["eager"][i]) for i in range(len(prompts))]
    agree = [_leading_equal(results["graphed"][i], reference[i].codes) for i in range(len(prompts))]
    return {"graphed_equals_eager": all(identical), "requests_identical": sum(identical),
            "requests": len(prompts), "frames": [int(r.shape[0]) for r in results["graphed"]],
            "reference_frames": [int(r.codes.shape[0]) for r in reference],
            "leading_frames_equal_to_reference": agree}


def _staggered(bench: Bench, prompts, params) -> list[torch.Tensor]:
    """4 requests, then 4 more at request 0's first chunk; every submit comes from the engine
    thread (the first 4 when a one-frame kick request finishes), so both engines batch the
    same requests at the same steps."""
    sink = bench.sink = Sink(len(prompts) + 1)

    def submit(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            bench.engine.submit(EngineRequest(f"eq{i}", prompts[i], params[i]))

    def on_chunk(event):
        if event.request_id == "eq0" and event.frame_offset == 0:
            submit(4, len(prompts))

    sink.on_chunk = on_chunk
    sink.on_finish = lambda event: submit(0, 4) if event.request_id == "kick" else None
    bench.engine.submit(EngineRequest("kick", prompts[0], fixed_length(0, 1)))
    assert sink.all_done.wait(TIMEOUT_S)
    return [sink.all_codes(f"eq{i}") for i in range(len(prompts))]


def _leading_equal(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[0], b.shape[0])
    differs = (a[:n] != b[:n]).any(-1).nonzero()
    return int(differs[0]) if differs.numel() else n


def offline(bench: Bench, batches: list[int]) -> list[dict]:
    rows = []
    for b in batches:
        prompts = [random_prompt_rows(bench.prompt_rows, 1000 + i) for i in range(b)]
        params = [fixed_length(i, bench.frames) for i in range(b)]
        before = bench.engine.stats()
        seconds, sink = bench.batch(prompts, params, f"off{b}-")
        after = bench.engine.stats()
        frames = sum(f.num_frames for f in sink.finals.values())
        rows.append({"batch": b, "seconds": seconds, "frames": frames, "frames_per_s": frames / seconds,
                     "audio_s_per_s": frames / FRAME_RATE / seconds, "steps": after.steps - before.steps,
                     "graph_hits": after.decode_graph_hits - before.decode_graph_hits,
                     "graph_fallbacks": after.decode_graph_fallbacks - before.decode_graph_fallbacks,
                     "host_ms": after.step_host_ms - before.step_host_ms,
                     "wait_ms": after.step_wait_ms - before.step_wait_ms})
    return rows


def steady_state(bench: Bench, batch: int, replays: int) -> tuple[int, float]:
    """Slots [0, batch) mid-generation as in this benchmark's own steady state: every prompt
    has prompt_rows rows and slot s is frame (s x frames / batch) into its request, so KV lengths
    spread over [prompt_rows, prompt_rows + frames). Returns (KV window bucket that covers
    `replays` more steps, mean KV length). The engine must be idle; reset afterwards."""
    runner = bench.engine._runner
    st, device = runner.ctx.state, runner.device
    floats, ints = param_rows(fixed_length(0, 22_500))
    slots = torch.arange(batch, device=device)
    st.assign(slots, torch.tensor([floats] * batch, device=device), torch.tensor([ints] * batch, device=device))
    lengths = bench.prompt_rows + torch.arange(batch) * bench.frames // batch
    st.lengths[:batch] = lengths.to(device)
    st.active[:batch] = True
    window = runner.buckets.decode_shape(batch, int(lengths.max()) + replays + 1)[1]
    return window, float(lengths.float().mean()) + replays / 2


def step_times(bench: Bench, batches: list[int]) -> list[dict]:
    graphs, rows = bench.engine._runner.graphs, []
    for b in batches:
        window, mean_len = steady_state(bench, b, 23)
        ms = time_replays(lambda: graphs.replay_decode(b, window))
        bench.engine._runner.ctx.state.reset()
        rows.append({"batch": b, "kv_len": window, "mean_kv_rows": mean_len, "ms": ms,
                     "frames_per_s": b / ms * 1000, "audio_s_per_s": b / ms * 1000 / FRAME_RATE})
    return rows


def time_replays(replay, iters: int = 20) -> float:
    for _ in range(3):
        replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / iters


def latency(bench: Bench, concurrency: int, repeats: int, make_prompt=None, tag: str = "lat") -> dict:
    """Submit -> first 2 / first 5 frames of `concurrency` requests at once, `repeats` times;
    make_prompt(repeat, index) gives the prompts (default: distinct random ones)."""
    if make_prompt is None:
        def make_prompt(r, i):
            return random_prompt_rows(bench.prompt_rows, 5000 + 100 * r + i)
    first2, first5 = [], []
    chunking = dict(first_chunk_frames=2, chunk_frames=3)
    for r in range(repeats):
        prompts = [make_prompt(r, i) for i in range(concurrency)]
        params = [fixed_length(i, 8) for i in range(concurrency)]
        _, sink = bench.batch(prompts, params, f"{tag}{concurrency}-{r}-", **chunking)
        first2 += [sink.time_to(rid, 2) * 1000 for rid in sink.finals]
        first5 += [sink.time_to(rid, 5) * 1000 for rid in sink.finals]
    return {"concurrency": concurrency, "first2_ms_median": statistics.median(first2),
            "first2_ms_max": max(first2), "first5_ms_median": statistics.median(first5),
            "first5_ms_max": max(first5), "samples": len(first2)}


def naive(model, batches: list[int], frames: int, prompt_rows: int) -> list[dict]:
    rows = []
    generate(model, [random_prompt_rows(prompt_rows, 0)], [fixed_length(0, 2)])  # warm-up
    for b in batches:
        prompts = [random_prompt_rows(prompt_rows, 1000 + i) for i in range(b)]
        params = [fixed_length(i, frames) for i in range(b)]
        _sync(model)
        start = time.perf_counter()
        out = generate(model, prompts, params)
        _sync(model)
        seconds = time.perf_counter() - start
        n = sum(r.codes.shape[0] for r in out)
        rows.append({"batch": b, "seconds": seconds, "frames_per_s": n / seconds,
                     "audio_s_per_s": n / FRAME_RATE / seconds, "ms_per_step": seconds / frames * 1000})
    return rows


def split(bench: Bench, batches: list[int]) -> list[dict]:
    """Graph-replay time of one step's parts in the steady state: backbone, local frame, whole;
    fused vs unfused kernels; decode kernel vs SDPA attention."""
    runner = bench.engine._runner
    ctx, pool = runner.ctx, torch.cuda.graph_pool_handle()
    rows = []
    for b in batches:
        kv_len, _ = steady_state(bench, b, 24)  # each part starts from this state again
        hidden = torch.zeros(b, bench.model.cfg.hidden_size, device=runner.device, dtype=runner.dtype)
        parts = {
            "step_fused": lambda: step.decode_step(ctx, b, kv_len),
            "backbone_fused": lambda: _backbone_part(ctx, b, kv_len),
            "frame_fused": lambda: frame.sample_frame(ctx.model, ctx.fusions, ctx.rope, hidden,
                                                      ctx.state.view(b), ctx.state.frame_index[:b],
                                                      ctx.sampler_kernel, ctx.local_kernel),
            "step_unfused": lambda: step.decode_step(replace(ctx, fusions=Fusions.eager()), b, kv_len),
            "step_sdpa": lambda: step.decode_step(replace(ctx, attention_kernel=False), b, kv_len),
            # qkv_kernels=false: the compiled norm/RoPE kernels and index copies (step_qkv's A/B)
            "step_no_qkv_kernels": lambda: step.decode_step(replace(ctx, qkv_kernel=False, local_kernel=False),
                                                            b, kv_len),
            "backbone_no_qkv_kernels": lambda: _backbone_part(replace(ctx, qkv_kernel=False), b, kv_len),
            # the SiLU passes compiled with dynamic shapes, as before kernels/gated_silu.py
            "step_compiled_silu": lambda: step.decode_step(replace(ctx, fusions=compiled_silu(ctx.fusions)), b, kv_len),
        }
        row = {"batch": b, "kv_len": kv_len}
        for name, fn in parts.items():
            steady_state(bench, b, 24)
            row[name + "_ms"] = time_replays(_graph_of(fn, pool).replay)
        ctx.state.reset()
        rows.append(row)
    return rows


def shared_prompts(count: int, rows: int, shared: int, seed: int, first: int = 0) -> list[torch.Tensor]:
    """`count` prompts of `rows` rows whose first `shared` rows are the same (one speaker) and
    whose rest differs (suffixes first, first + 1, ...)."""
    head = random_prompt_rows(shared, seed)
    return [torch.cat([head, random_prompt_rows(rows - shared, seed + 1 + first + i)]) for i in range(count)]


def prefix_reuse(bench: Bench, batch: int, shared: int) -> dict:
    """A warm pool (one earlier request of the speaker), then `batch` prompts of that speaker at
    once, and 5 single ones for latency."""
    rows = bench.prompt_rows
    bench.batch(shared_prompts(1, rows, shared, 7000, first=10_000), [fixed_length(0, 2)], "warm-")
    before = bench.engine.stats()
    prompts = shared_prompts(batch, rows, shared, 7000)
    seconds, sink = bench.batch(prompts, [fixed_length(i, bench.frames) for i in range(batch)], "pre-")
    after = bench.engine.stats()
    frames = sum(f.num_frames for f in sink.finals.values())
    single = latency(bench, 1, 5, lambda r, i: shared_prompts(1, rows, shared, 7000, first=20_000 + r)[0],
                     tag="prelat")
    end = bench.engine.stats()
    return {"batch": batch, "shared_rows": shared, "seconds": seconds, "frames_per_s": frames / seconds,
            "audio_s_per_s": frames / FRAME_RATE / seconds,
            "reused_rows": after.prefix_reused_rows - before.prefix_reused_rows,
            "prompt_rows": after.prefix_prompt_rows - before.prefix_prompt_rows,
            **{k: v for k, v in single.items() if k.startswith("first")},
            "latency_reused_rows": end.prefix_reused_rows - after.prefix_reused_rows,
            "prefill_graph_hits": end.prefill_graph_hits - after.prefill_graph_hits}


def profile_step(bench: Bench, batch: int, out: Path | None) -> dict:
    """GPU kernel time by name of one decode step in the steady state (3 profiled), eager and by
    graph replay (kernels inside a graph are traced too), with the served kernels and with
    qkv_kernels=false: where a step's time goes, and what step_qkv changed."""
    ctx = bench.engine._runner.ctx
    result = {}
    for name, variant in (("", ctx), ("_no_qkv_kernels", replace(ctx, qkv_kernel=False, local_kernel=False))):
        for graphed in (False, True):
            key = ("graph" if graphed else "eager") + name
            result[key] = _profile(bench, variant, batch, graphed, out and out / f"profile_{key}.txt")
    return {"batch": batch, **result}


def _profile(bench: Bench, ctx, batch: int, graphed: bool, table: Path | None) -> dict:
    from torch.profiler import ProfilerActivity, profile

    kv_len, _ = steady_state(bench, batch, 4)
    with torch.inference_mode():
        run = lambda: step.decode_step(ctx, batch, kv_len)  # noqa: E731
        if graphed:
            run = _graph_of(run, torch.cuda.graph_pool_handle()).replay
        run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                run()
            torch.cuda.synchronize()
        ctx.state.reset()
    events = prof.key_averages()
    total = sum(e.device_time_total for e in events) / 3 / 1000
    top = sorted(events, key=lambda e: e.device_time_total, reverse=True)[:30]
    rows = [{"name": e.key[:90], "ms_per_step": e.device_time_total / 3 / 1000, "calls_per_step": e.count / 3}
            for e in top]
    if table is not None:
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(events.table(sort_by="device_time_total", row_limit=80))
    return {"kv_len": kv_len, "kernel_ms_per_step": total, "kernels_per_step": sum(e.count for e in events) / 3,
            "top": rows}


def prefill_probe(bench: Bench, rows: int) -> list[dict]:
    """Eager batched prefills run directly on the idle engine's runner (slots then reset)."""
    runner = bench.engine._runner
    out = []
    with torch.inference_mode():
        for n in (16, 16, 37, 37, 54, 54):
            inputs = runner._dummy_inputs(n, runner.buckets.prefill_len(n, rows))
            torch.cuda.synchronize()
            start = time.perf_counter()
            step.prefill_step(runner.ctx, inputs)
            launched = time.perf_counter()
            torch.cuda.synchronize()
            out.append({"prompts": n, "host_ms": (launched - start) * 1000,
                        "total_ms": (time.perf_counter() - start) * 1000})
        runner.ctx.state.reset()
    return out


def fp32_equivalence(frames: int, prompt_rows: int) -> dict:
    """Float32 weights, TF32 off: the engine's GPU path (graphs, unfused kernels) against the
    reference loop, where rounding is too small to flip samples."""
    cfg = MossTTSConfig.from_dict(real_model_config_dict(), "real")
    model = build_random_model(cfg, "cuda", torch.float32, seed=0)
    config = EngineConfig(max_running_requests=8, max_seq_len=256, cuda_graph_prefill_tokens=256,
                          fuse_kernels=False)
    bench = Bench(model, config, frames, prompt_rows)
    prompts, params = mixed_requests(frames, prompt_rows)
    got = _staggered(bench, prompts, params)
    stats = bench.engine.stats()
    bench.close()
    reference = generate(model, prompts, params)
    del model, bench
    torch.cuda.empty_cache()
    same = [torch.equal(g, r.codes) for g, r in zip(got, reference)]
    return {"requests_identical": sum(same), "requests": len(same), "frames": [int(g.shape[0]) for g in got],
            "leading_frames_equal": [_leading_equal(g, r.codes) for g, r in zip(got, reference)],
            "decode_graph_hits": stats.decode_graph_hits, "prefill_graph_hits": stats.prefill_graph_hits}


def compiled_silu(fusions: Fusions) -> Fusions:
    """fusions with the two SiLU passes torch.compile'd (dynamic shapes), as served before gated_silu."""
    fuse = functools.partial(torch.compile, dynamic=True, fullgraph=True)
    return replace(fusions, silu_mul_merged=fuse(fused.silu_mul_merged), silu=fuse(fused.silu))


def _backbone_part(ctx, b: int, kv_len: int):
    model, st = ctx.model, ctx.state
    rows = model.feedback_rows(st.last_codes[:b], st.active[:b]).unsqueeze(1)
    embeds = model.embed_rows(rows).to(model.dtype)
    return backbone.decode(model.transformer, ctx.fusions, ctx.cache, embeds, ctx.slot_ids[:b],
                           st.lengths[:b], kv_len, ctx.attention_kernel, ctx.qkv_kernel)


def _graph_of(fn, pool) -> torch.cuda.CUDAGraph:
    with torch.inference_mode():
        fn()
        torch.cuda.synchronize()
        return capture_graph(fn, pool)


def _sync(model) -> None:
    if model.local_text_lm_head.weight.is_cuda:
        torch.cuda.synchronize()


# ---- report ----

def table(results: dict) -> str:
    lines = ["", "=" * 78, f"MOSS-TTS-Local engine benchmark  {results['meta']['device']}  "
             f"{results['meta']['frames']} frames/request, prompt {results['meta']['prompt_rows']} rows, "
             f"decode attention grid {results['meta'].get('decode_order', 'slots (before round 22)')}"]
    if "equivalence" in results:
        e = results["equivalence"]
        lines.append(f"equivalence  graphed == eager engine: {e['graphed_equals_eager']} "
                     f"({e['requests_identical']}/{e['requests']} requests, frames {e['frames']})")
        lines.append(f"             leading frames equal to generation.generate (bf16): "
                     f"{e['leading_frames_equal_to_reference']} of {e['reference_frames']}")
    if results.get("fp32"):
        e = results["fp32"]
        lines.append(f"equivalence  fp32 graphed engine == generation.generate: {e['requests_identical']}/"
                     f"{e['requests']} requests identical, leading equal frames {e['leading_frames_equal']} "
                     f"of {e['frames']}")
    lines.append(f"{'':14}{'batch':>6}{'frames/s':>11}{'audio-s/s':>11}{'ms/step':>9}  note")
    for r in results.get("naive", []):
        lines.append(f"{'naive loop':14}{r['batch']:>6}{r['frames_per_s']:>11.1f}{r['audio_s_per_s']:>11.2f}"
                     f"{r['ms_per_step']:>9.1f}  generation.generate, eager")
    for r in results.get("offline", []):
        lines.append(f"{'engine':14}{r['batch']:>6}{r['frames_per_s']:>11.1f}{r['audio_s_per_s']:>11.2f}"
                     f"{'':>9}  end to end incl. prefill, {r['steps']} steps, graph hits "
                     f"{r['graph_hits']}/fallbacks {r['graph_fallbacks']}, engine thread host "
                     f"{r.get('host_ms', 0) / 1000:.2f} s + waiting {r.get('wait_ms', 0) / 1000:.2f} s")
    for r in results.get("step", []):
        lines.append(f"{'decode step':14}{r['batch']:>6}{r['frames_per_s']:>11.1f}{r['audio_s_per_s']:>11.2f}"
                     f"{r['ms']:>9.2f}  graph replay, kv window {r['kv_len']}, mean kv rows {r['mean_kv_rows']:.0f}")
    if results.get("naive") and results.get("offline"):
        best_naive = max(r["frames_per_s"] for r in results["naive"])
        best = max(r["frames_per_s"] for r in results["offline"])
        lines.append(f"speedup vs the naive loop's better figure ({best_naive:.1f} frames/s): "
                     f"{best / best_naive:.0f}x end to end" + (
                         f", {max(r['frames_per_s'] for r in results['step']) / best_naive:.0f}x decode step"
                         if results.get("step") else ""))
    for r in results.get("latency", []):
        lines.append(f"latency c={r['concurrency']:<3} first 2 frames {r['first2_ms_median']:.1f} ms median "
                     f"({r['first2_ms_max']:.1f} max), first 5 frames {r['first5_ms_median']:.1f} ms median "
                     f"({r['first5_ms_max']:.1f} max), n={r['samples']}")
    for r in results.get("split", []):
        lines.append(f"split b={r['batch']:<4} step {r['step_fused_ms']:.2f} ms = backbone "
                     f"{r['backbone_fused_ms']:.2f} + frame {r['frame_fused_ms']:.2f}; unfused step "
                     f"{r['step_unfused_ms']:.2f} ms (kv window {r['kv_len']})")
    for r in results.get("split", []):
        if "step_no_qkv_kernels_ms" in r:
            lines.append(f"split b={r['batch']:<4} qkv_kernels=false: step {r['step_no_qkv_kernels_ms']:.2f} ms, "
                         f"backbone {r['backbone_no_qkv_kernels_ms']:.2f} ms; compiled SiLU: step "
                         f"{r['step_compiled_silu_ms']:.2f} ms")
        if "step_sdpa_ms" in r:
            lines.append(f"split b={r['batch']:<4} step with SDPA attention instead of the decode kernel "
                         f"{r['step_sdpa_ms']:.2f} ms")
    if results.get("prefix"):
        r = results["prefix"]
        lines.append(f"prefix reuse  batch {r['batch']}, {r['shared_rows']} of {results['meta']['prompt_rows']} "
                     f"rows shared: {r['frames_per_s']:.1f} frames/s = {r['audio_s_per_s']:.2f} audio-s/s end to "
                     f"end, {r['reused_rows']}/{r['prompt_rows']} prompt rows reused")
        lines.append(f"prefix reuse  c=1 first 2 frames {r['first2_ms_median']:.1f} ms median ({r['first2_ms_max']:.1f}"
                     f" max), first 5 {r['first5_ms_median']:.1f} ms ({r['first5_ms_max']:.1f} max), "
                     f"reused rows {r['latency_reused_rows']}, prefill graph hits {r['prefill_graph_hits']}")
    if results.get("profile"):
        p = results["profile"]
        for key, r in p.items():
            if isinstance(r, dict):
                lines.append(f"profile b={p['batch']} {key}: kernel time {r['kernel_ms_per_step']:.2f} ms, "
                             f"{r['kernels_per_step']:.0f} kernels; top: " + "; ".join(
                                 f"{t['name'][:40]} {t['ms_per_step']:.2f}" for t in r["top"][:8]))
    if results.get("probe"):
        lines.append("eager prefill (150-row prompts): " + ", ".join(
            f"{r['prompts']}: {r['total_ms']:.0f} ms (host {r['host_ms']:.0f})" for r in results["probe"]))
    for name, err in results.get("errors", {}).items():
        lines.append(f"ERROR in {name}: {err.splitlines()[-1]}")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="directory for bench.json")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run on a tiny random model")
    ap.add_argument("--frames", type=int, default=112)
    ap.add_argument("--prompt-rows", type=int, default=150)
    ap.add_argument("--batches", default="1,16,64,128,256")
    ap.add_argument("--naive-batches", default="1,16")
    ap.add_argument("--shared-rows", type=int, default=128, help="prefix section: rows all prompts share")
    ap.add_argument("--max-seq-len", type=int, default=0,
                    help="engine max_seq_len (default: prompt rows + frames + 122, windows 256 and 384)")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    ap.add_argument("--decode-order", choices=("slots", "heads"), default="heads",
                    help="the decode attention's grid order for every step of this run (DecodeConfig.heads_first)")
    ap.add_argument("--decode-config", default="",
                    help="BLOCK_N,WARPS,STAGES[,FP16_DOTS]: the decode attention's tile for every step of this run, whatever "
                         "the cache's dtype (DecodeConfig; default: the kernel's own, DEFAULT_CONFIG / FP8_CONFIG)")
    ap.add_argument("--kv-cache-dtype", choices=kv_format.KV_CACHE_DTYPES, default="auto",
                    help="the engine's KV cache (EngineConfig.kv_cache_dtype; fp8: perf/bench_kv_fidelity.py)")
    return ap.parse_args(argv)


def build(args):
    if args.tiny:
        from moss_tts.tools.make_tiny_checkpoint import tiny_model_config_dict

        cfg = MossTTSConfig.from_dict(tiny_model_config_dict(), "tiny")
        return build_random_model(cfg, "cpu", torch.float32, seed=0, std=0.15), "cpu"
    cfg = MossTTSConfig.from_dict(real_model_config_dict(), "real")
    model = build_random_model(cfg, "cuda", torch.bfloat16, seed=0)
    return model, torch.cuda.get_device_name()


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("moss_tts").setLevel(logging.INFO)
    batches = [int(b) for b in args.batches.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    torch.manual_seed(0)
    # The grid order of every decode attention in this run (served: heads). decode_attention reads
    # its module's DEFAULT_CONFIG at each call, so an A/B of the step is one process per order
    decode_attention.DEFAULT_CONFIG = replace(decode_attention.DEFAULT_CONFIG,
                                              heads_first=args.decode_order == "heads")
    decode_attention.FP8_CONFIG = replace(decode_attention.FP8_CONFIG, heads_first=args.decode_order == "heads")
    decode_attention.INT8_CONFIG = replace(decode_attention.INT8_CONFIG, heads_first=args.decode_order == "heads")
    if args.decode_config:
        block_n, warps, stages, *fp16 = map(int, args.decode_config.split(","))
        decode_attention.DEFAULT_CONFIG = decode_attention.FP8_CONFIG = decode_attention.INT8_CONFIG = replace(
            decode_attention.DEFAULT_CONFIG, block_n=block_n, num_warps=warps, num_stages=stages,
            fp16_dots=bool(fp16 and fp16[0]))
    start = time.perf_counter()
    model, device = build(args)
    results = {"meta": {"device": device, "torch": torch.__version__,
                        "stack": os.environ.get("MOSS_STACK", "unchecked (not under the device pack's env.sh)"),
                        # which tree's code ran: the pack's env.sh puts the directory it was sourced
                        # in first on every Python's path, whatever PYTHONPATH says (an A/B of two
                        # trees must source it in each; issue 34, sixth round)
                        "moss_tts": sys.modules["moss_tts"].__file__,
                        "frames": args.frames, "decode_order": args.decode_order,
                        "kv_cache_dtype": args.kv_cache_dtype, "decode_config": args.decode_config,
                        "prompt_rows": args.prompt_rows, "model_build_s": time.perf_counter() - start},
               "errors": {}}
    config = EngineConfig(max_running_requests=max(batches), max_queue=1024,
                          max_seq_len=args.max_seq_len or args.prompt_rows + args.frames + 122,
                          prefill_chunk_tokens=8192, kv_cache_dtype=args.kv_cache_dtype)
    bench = Bench(model, config, args.frames, args.prompt_rows)
    results["meta"]["engine_setup_s"] = bench.setup_s
    is_gpu = not args.tiny
    sections = [
        ("equivalence", lambda: equivalence(model, bench, min(args.frames, 40))),
        ("offline", lambda: offline(bench, batches)),
        ("step", lambda: step_times(bench, batches) if is_gpu else []),
        ("latency", lambda: [latency(bench, 1, 5), latency(bench, min(64, max(batches)), 1)]),
        ("probe", lambda: prefill_probe(bench, args.prompt_rows) if is_gpu else []),
        ("split", lambda: split(bench, [1, max(batches)]) if is_gpu else []),
        ("naive", lambda: naive(model, [int(b) for b in args.naive_batches.split(",")], args.frames,
                                args.prompt_rows)),
        ("prefix", lambda: prefix_reuse(bench, max(batches), args.shared_rows)),
        ("profile", lambda: profile_step(bench, max(batches), args.out) if is_gpu else {}),
        ("fp32", lambda: fp32_equivalence(min(args.frames, 40), args.prompt_rows) if is_gpu else {}),
    ]
    for name, run in sections:
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            results[name] = run()
        except Exception:  # keep the other sections' numbers
            results["errors"][name] = traceback.format_exc()
            print(results["errors"][name], file=sys.stderr, flush=True)
        results["meta"][f"{name}_s"] = time.perf_counter() - t0
        print(f"[{name}] {json.dumps(results.get(name), default=str)[:2000]}", flush=True)
    stats = bench.engine.stats()
    results["meta"]["engine_stats"] = stats.__dict__
    bench.close()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    print(table(results), flush=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
