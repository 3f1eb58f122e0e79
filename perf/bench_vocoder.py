"""Vocoder benchmark: one streaming codec step, eager vs CUDA-graphed (VocoderGraphs), in-process.

    PYTHONPATH=python_backends:. python3 perf/bench_vocoder.py --out vocoder.json   # GPU, real-size codec, ~3 min
    PYTHONPATH=python_backends:. python3 perf/bench_vocoder.py --device cpu --tiny  # CPU smoke of the script

The real-size MOSS-Audio-Tokenizer-v2 decoder with seeded random weights (bf16), one decode
state of max(rows) + 1 slots as VocoderSessions allocates it, random codes. A step is what
VocoderSessions._step does for one group: host codes in (numpy), one packed step on the rows in
place (graphed: decode_step_packed; eager: the batched decode_step), host fp32 audio out (the one
device-to-host copy included, into pinned memory). Sections, each also in the JSON:
  capture      graphs for every reachable (row bucket, frame bucket) up to max(rows) rows of 1 ..
               --max-graph-frames frames: count, seconds, pool memory (CUDA only; on the CPU the
               graphs' padded step runs uncaptured)
  equivalence  per shape, two chunks from fresh slots: graphed == uncaptured padded step (must
               hold bit for bit: same kernels, same shapes) and graphed == eager step (holds too
               when the rows are a bucket size, as in the default shapes)
  streaming    --stream-rows rows streamed through the graphs in the pipeline's chunks (2, 10, 10,
               8) against codec.decode of the same codes: max |diff| / peak per row
  step         ms per call (median of --iters after --warmup, synchronized), eager vs graphed,
               and audio-s/s = rows x frames / 12.5 / seconds
  rounds       --rounds ROWS vocoder rounds whose rows bring 1..--max-graph-frames frames (seeded,
               uniform): one packed graph step per round against one graph step per distinct
               length (how rounds ran before packing), ms and frames/s each; and the packed
               round's parts: the replay of inputs already staged, and the host staging alone
  offline      codec.decode of --offline ROWSxFRAMES codes already on the device (no host copy)
  fidelity     (--fidelity ROWSxFRAMES) the served form's offline decode against the fp32
               reference: the same seeded weights, loaded form, computed in fp32. Max |diff| /
               peak and SNR in dB (worst row): what bf16 and the --fusion cost the audio
  ring_fidelity  (--ring-fidelity ROWSxFRAMES) those codes streamed (eager decode_step, chunks of
               2, 4, 8 and 10 frames) with the --ring-dtype rings against the same served form's
               exact rings: what storing the rings in fewer bytes costs the streamed audio (SNR)
  attention_sweep  (--attention-sweep, CUDA) window attention alone per decoder stage shape and
               tile config; streaming shapes time both ring kernels (split, fused) in one process
Every section runs the codec's serving form with --fusion, --ring-kernel and --ring-dtype (in
the JSON's meta); the attention sweep builds its own rings, in the activations' dtype. A/B of the ring kernels: the same command with --ring-kernel split and fused.
Exit status 1 when a section failed or graphed != padded.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from moss_tts.codec import CodecConfig, build_codec, build_real_size_codec, init_random_
from moss_tts.codec.config import tiny_codec_config_dict
from moss_tts.codec.transformer import DEFAULT_FUSION, DEFAULT_RING_DTYPE, DEFAULT_RING_KERNEL, RING_DTYPES, RING_KERNELS
from moss_tts.kernels import fused_window_attention as fwa
from moss_tts.kernels import window_attention as wa
from moss_tts.vocoder.graphs import VocoderGraphs
from moss_tts.vocoder.step_buffers import to_host
from perf.graph_timing import graph_ms

FRAME_RATE = 12.5  # codec frames per second of audio
N_VQ = 12  # codebooks the pipeline sends
GIB = 1024 ** 3


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"1x2,16x10" -> [(1, 2), (16, 10)]: (rows, frames)."""
    return [tuple(int(n) for n in item.split("x")) for item in text.split(",") if item]


def build(args) -> tuple[torch.nn.Module, torch.device]:
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        torch.cuda.set_device(device)
    # The form the vocoder serves (and what the offline section times): codec.serving_form_().
    return loaded_codec(args, device).serving_form_(args.fusion, args.ring_kernel, args.small_gemm_rows,
                                                    args.ring_dtype), device


def loaded_codec(args, device: torch.device) -> torch.nn.Module:
    """The seeded random codec as loaded (tiny: fp32; real size: bf16)."""
    if args.tiny:
        config = CodecConfig.from_dict(tiny_codec_config_dict(), "tiny_codec_config_dict()")
        return init_random_(build_codec(config, device, torch.float32), seed=0)
    return build_real_size_codec(device, torch.bfloat16)


def rel_diff_per_row(got: torch.Tensor, expected: torch.Tensor) -> list[float]:
    """max |got - expected| / peak |expected| of each row of audio [rows, ...]."""
    return [((got[i] - expected[i]).abs().max() / expected[i].abs().max()).item() for i in range(got.shape[0])]


def fidelity(codec, args, device: torch.device, shape: tuple[int, int]) -> dict:
    """The served codec's offline decode against the fp32 reference of the same weights (the
    loaded form, its bf16 values widened, every op in fp32): worst row's max |diff| / peak and
    SNR. The reference is built, run and freed before the served codec decodes."""
    rows, frames = shape
    codes = torch.stack(random_codes(rows, frames, codec.codebook_size, 5)).to(device)
    reference = loaded_codec(args, device).float()
    with torch.no_grad():
        expected = reference.decode(codes).float()
    del reference
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with torch.no_grad():
        got = codec.decode(codes).float()
    error = got - expected
    snr = [10 * math.log10(expected[i].square().sum().item() / max(error[i].square().sum().item(), 1e-30))
           for i in range(rows)]
    return {"rows": rows, "frames": frames, "fusion": args.fusion, "ring_kernel": args.ring_kernel,
            "small_gemm_rows": args.small_gemm_rows,
            "max_rel_diff": max(rel_diff_per_row(got, expected)), "snr_db_min": min(snr),
            "snr_db_mean": statistics.fmean(snr)}


def ring_fidelity(codec, device: torch.device, shape: tuple[int, int]) -> dict:
    """The served form streaming random codes with its rings (serving_form_'s ring_dtype) against
    itself with exact rings: worst row's SNR and max |diff| / peak."""
    rows, frames = shape
    codes = torch.stack(random_codes(rows, frames, codec.codebook_size, 7)).to(device)
    audio = {}
    for ring_dtype in ("auto", codec.ring_dtype):
        state, out, start, sizes = codec.new_decode_state(rows, device, ring_dtype=ring_dtype), [], 0, (2, 4, 8, 10)
        with torch.no_grad():
            while start < frames:
                n = min(sizes[len(out) % len(sizes)], frames - start)
                out.append(codec.decode_step(codes[:, start:start + n], state).float())
                start += n
        audio[ring_dtype] = torch.cat(out, dim=-1)
    expected, got = audio["auto"], audio[codec.ring_dtype]
    error = got - expected
    snr = [10 * math.log10(expected[i].square().sum().item() / max(error[i].square().sum().item(), 1e-30))
           for i in range(rows)]
    return {"rows": rows, "frames": frames, "ring_dtype": codec.ring_dtype, "snr_db_min": min(snr),
            "max_rel_diff": max(rel_diff_per_row(got, expected))}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn, device: torch.device, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class Steps:
    """The three ways to run one step on a shared state: eager, graphed, padded uncaptured."""

    def __init__(self, codec, device: torch.device, max_rows: int, max_frames: int):
        self.codec, self.device = codec, device
        self.state = codec.new_decode_state(max_rows + 1, device)  # + the graphs' scratch row
        self.graphs = VocoderGraphs(codec, self.state, max_rows, max_frames, N_VQ)
        self.padded = VocoderGraphs(codec, self.state, max_rows, max_frames, N_VQ)  # never captured

    def capture(self) -> dict:
        if self.device.type != "cuda":
            return {}
        before = torch.cuda.memory_reserved()
        start = time.perf_counter()
        self.graphs.capture()
        return {"graphs": self.graphs.num_graphs, "buckets": list(self.graphs.buckets),
                "seconds": time.perf_counter() - start,
                "pool_gib": (torch.cuda.memory_reserved() - before) / GIB,
                "state_gib": sum(c.numel() * c.element_size() for c in self.state.caches) / GIB,
                "reserved_gib": torch.cuda.memory_reserved() / GIB}

    def eager(self, slots: list[int], codes: list[torch.Tensor]) -> torch.Tensor:
        rows = torch.tensor(slots, device=self.device)
        return to_host(self.codec.decode_step(torch.stack(codes).to(self.device), self.state, rows))

    def graphed(self, slots: list[int], codes: list[torch.Tensor]) -> torch.Tensor:
        return by_row(to_host(self.graphs.run(slots, host_codes(codes))), len(slots))

    def padded_eager(self, slots: list[int], codes: list[torch.Tensor]) -> torch.Tensor:
        return by_row(to_host(self.padded.run(slots, host_codes(codes))), len(slots))

    def reset(self, num_rows: int) -> None:
        self.state.reset_rows(list(range(num_rows)))


def by_row(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """A packed step's audio [2, rows*T*3840] of rows that all brought T frames -> [rows, 2, T*3840]."""
    return packed.view(packed.shape[0], rows, -1).transpose(0, 1)


def host_codes(codes: list[torch.Tensor]) -> list:
    """Per row, its codes [T_i, n_vq] as the numpy array VocoderGraphs.run takes (as VocoderSessions
    hands them); rows may differ in length."""
    return [c.numpy() for c in codes]


def random_codes(rows: int, frames: int, codebook_size: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return list(torch.randint(0, codebook_size, (rows, frames, N_VQ), generator=g).unbind(0))


def equivalence(steps: Steps, shapes: list[tuple[int, int]], codebook_size: int) -> list[dict]:
    rows_out = []
    for rows, frames in shapes:
        slots = list(range(rows))
        chunks = [random_codes(rows, frames, codebook_size, seed) for seed in (1, 2)]
        audio = {}
        for name in ("graphed", "padded_eager", "eager"):
            steps.reset(rows)
            audio[name] = torch.cat([getattr(steps, name)(slots, c) for c in chunks], dim=-1)
        diff = (audio["graphed"] - audio["eager"]).abs().max().item()
        rows_out.append({"rows": rows, "frames": frames,
                         "graphed_equals_padded": torch.equal(audio["graphed"], audio["padded_eager"]),
                         "graphed_equals_eager": torch.equal(audio["graphed"], audio["eager"]),
                         "max_abs_diff_vs_eager": diff, "finite": bool(torch.isfinite(audio["graphed"]).all())})
    return rows_out


def streaming(steps: Steps, rows: int, codebook_size: int, chunks=(2, 10, 10, 8)) -> dict:
    """The pipeline's chunks through the graphs against offline codec.decode of the same codes."""
    codes = torch.stack(random_codes(rows, sum(chunks), codebook_size, seed=5))
    steps.reset(rows)
    slots, start, parts = list(range(rows)), 0, []
    for size in chunks:
        parts.append(steps.graphed(slots, list(codes[:, start:start + size].unbind(0))))
        start += size
    streamed = torch.cat(parts, dim=-1)
    offline = steps.codec.decode(codes.to(steps.device)).float().cpu()
    diffs = rel_diff_per_row(streamed, offline)
    return {"rows": rows, "chunks": list(chunks), "max_rel_diff": max(diffs), "rel_diff_per_row": diffs,
            "finite": bool(torch.isfinite(streamed).all())}


# (stage heads, window, tokens per row of a 10-frame chunk) of the real decoder's six stages
STAGES = ((20, 125, 10), (12, 250, 20), (12, 400, 40), (12, 400, 80), (12, 400, 160), (12, 400, 320))
# (block_m, block_n, num_warps, num_stages)
SWEEP = ((16, 16, 2, 2), (16, 32, 2, 2), (32, 32, 2, 2), (32, 32, 4, 2),  # short chunks: more unmasked tiles
         (16, 64, 2, 2), (16, 64, 4, 2), (16, 128, 4, 2), (16, 64, 4, 3), (32, 64, 2, 2), (32, 64, 4, 2),
         (32, 64, 4, 3), (32, 128, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3),
         (64, 64, 8, 3), (64, 32, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 2))


def _graph_ms(call, reps: int = 10, iters: int = 10) -> float:
    """Median ms of one call, from replays of a CUDA graph of `reps` calls (no launch gaps)."""
    return graph_ms(lambda _: call(), reps, iters)


def attention_sweep(device: torch.device, rows: int = 256, offline_rows: int = 32) -> list[dict]:
    """window_attention (RoPE + attention + ring write) per stage shape, per tile config: ms per
    call from graph replays, on random data with a ring of rows + 1 slots; the per-layer sum
    over the real decoder at 10 frames a row is in `step_ms`. Streaming shapes time both ring
    kernels (RING_KERNELS) in this one process: `ms` the split kernels, `fused_ms` the fused one
    at every config where it runs (no split fallback), and `packed_round` both at the default
    tiles on a packed round of `rows` rows of 1..10 frames (the graphs' served layout)."""
    out = []
    layers = (32, 12, 12, 12, 12, 12)
    shapes = [(h, w, t, rows, True, n) for (h, w, t), n in zip(STAGES, layers)] + [(12, 400, 3200, offline_rows, False, 12)]
    for heads, window, t, n, streaming, num_layers in shapes:
        row = _sweep_shape(device, heads, window, t, n, streaming, num_layers)
        if streaming:
            row["packed_round"] = _packed_round(device, heads, window, t // 10, n, num_layers)
        out.append(row)
        timed = {k: v for k, v in row["ms"].items() if isinstance(v, float)}
        fused = row.get("fused_ms", {}).get(row["default"])
        print(f"attention sweep heads {heads} window {window} tokens {t} rows {n}: best {row['best']} "
              f"{timed[row['best']]:.4f} ms, default {row['default']} {timed.get(row['default'], float('nan')):.4f} ms"
              + (f" (fused {fused:.4f} ms)" if isinstance(fused, float) else "") + "; "
              + ", ".join(f"{k} {v:.4f}" for k, v in sorted(timed.items(), key=lambda kv: kv[1])[:8])
              + (f"; packed round split {row['packed_round']['split_ms']:.4f} ms, fused "
                 f"{row['packed_round']['fused_ms']:.4f} ms" if streaming else ""), flush=True)
    return out


def _sweep_shape(device: torch.device, heads: int, window: int, t: int, n: int, streaming: bool,
                 num_layers: int) -> dict:
    """One attention_sweep shape: every SWEEP config, split (and fused where it runs)."""
    qkv = torch.randn(n, t, 3 * heads * 64, device=device, dtype=torch.bfloat16)
    offsets = torch.randint(0, 10 * window, (n,), device=device)
    rope = wa.rope_table((offsets if streaming else torch.zeros(1, device=device, dtype=torch.long))[:, None]
                         + torch.arange(t, device=device), 64, 1e4)
    ring = (wa.Ring(*(torch.randn(n + 1, heads, window, 64, device=device, dtype=torch.bfloat16) for _ in range(2)),
                    torch.randperm(n, device=device), offsets) if streaming else None)
    row = {"heads": heads, "window": window, "tokens": t, "rows": n, "streaming": streaming, "ms": {}}
    if streaming:
        row["fused_ms"] = {}
    for c in SWEEP:
        config = wa.AttentionConfig(*c)
        if config.block_m > max(16, 2 * t):
            continue
        name = "x".join(map(str, c))
        kernels = {"ms": wa._triton_window_attention}
        if streaming and fwa.runs_fused(t, config):
            kernels["fused_ms"] = fwa.fused_window_attention
        for key, kernel in kernels.items():
            try:
                row[key][name] = _graph_ms(lambda: kernel(qkv, rope, heads, window, ring, None, config))
            except Exception as exc:  # a config that does not compile (shared memory) is skipped
                row[key][name] = f"failed: {type(exc).__name__}"
    timed = {k: v for k, v in row["ms"].items() if isinstance(v, float)}
    d = wa.attention_config(t)
    row["default"] = "x".join(map(str, (d.block_m, d.block_n, d.num_warps, d.num_stages)))
    row["best"] = min(timed, key=timed.get)
    row["step_ms"] = {"best": timed[row["best"]] * num_layers, "default": timed.get(row["default"], 0) * num_layers}
    fused = row.get("fused_ms", {}).get(row["default"])
    if isinstance(fused, float):
        row["step_ms"]["fused_default"] = fused * num_layers
    return row


def _packed_round(device: torch.device, heads: int, window: int, scale: int, rows: int, num_layers: int,
                  max_frames: int = 10, seed: int = 0) -> dict:
    """Both ring kernels at the default tiles on one packed round: `rows` rows of 1..max_frames
    frames (`scale` tokens each, seeded) at random stream positions: ms per call and per step
    (x num_layers)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_frames + 1, (rows,), generator=gen) * scale
    offsets = torch.randint(0, 10 * window // scale, (rows,), generator=gen) * scale
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.cat([torch.arange(o, o + n) for o, n in zip(offsets.tolist(), lengths.tolist())])
    rope = wa.rope_table(positions[None].to(device), 64, 1e4)
    qkv = torch.randn(1, positions.numel(), 3 * heads * 64, device=device, dtype=torch.bfloat16)
    ring = wa.Ring(*(torch.randn(rows + 1, heads, window, 64, device=device, dtype=torch.bfloat16) for _ in range(2)),
                   torch.randperm(rows, generator=gen).to(device), offsets.to(device), starts.to(device),
                   lengths.to(device), max_frames * scale)
    out = {"rows": rows, "tokens": positions.numel(), "max_len": ring.max_len,
           "fused_runs": fwa.runs_fused(ring.max_len)}
    for kernel in RING_KERNELS:
        attend = fwa.fused_window_attention if kernel == "fused" else wa.window_attention
        out[f"{kernel}_ms"] = _graph_ms(lambda: attend(qkv, rope, heads, window, ring))
        out[f"{kernel}_step_ms"] = out[f"{kernel}_ms"] * num_layers
    return out


def step_times(steps: Steps, shapes: list[tuple[int, int]], codebook_size: int, iters: int, warmup: int) -> list[dict]:
    out = []
    for rows, frames in shapes:
        slots, codes = list(range(rows)), random_codes(rows, frames, codebook_size, 3)
        row = {"rows": rows, "frames": frames}
        for name in ("eager", "graphed"):
            ms = median_ms(lambda: getattr(steps, name)(slots, codes), steps.device, iters, warmup)
            row[f"{name}_ms"] = ms
            row[f"{name}_audio_s_per_s"] = rows * frames / FRAME_RATE / (ms / 1e3)
        row["speedup"] = row["eager_ms"] / row["graphed_ms"]
        out.append(row)
    return out


def round_codes(rows: int, max_frames: int, codebook_size: int, seed: int) -> tuple[list[int], list]:
    """A seeded round's mix: each row's frame count (uniform in 1..max_frames) and its host codes."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_frames + 1, (rows,), generator=g).tolist()
    return lengths, host_codes([random_codes(1, n, codebook_size, seed + i)[0] for i, n in enumerate(lengths)])


def rounds(steps: Steps, rows: int, codebook_size: int, iters: int, warmup: int, seed: int = 11) -> dict:
    """A vocoder round of `rows` sequences bringing 1..max_frames frames each: one packed graph
    step, against one graph step per distinct length (before packing, VocoderSessions grouped a
    round by chunk length; the per-length steps here replay the packed graphs of those shapes,
    the same kernels)."""
    lengths, host = round_codes(rows, steps.graphs.max_frames, codebook_size, seed)
    slots = list(range(rows))
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(n, []).append(i)

    def packed():
        to_host(steps.graphs.run(slots, host))

    def per_length():
        for members in groups.values():
            to_host(steps.graphs.run([slots[i] for i in members], [host[i] for i in members]))

    steps.reset(rows)
    out = {"rows": rows, "frames": sum(lengths), "distinct_lengths": len(groups)}
    for name, fn in (("packed", packed), ("per_length", per_length)):
        ms = median_ms(fn, steps.device, iters, warmup)
        out[f"{name}_ms"], out[f"{name}_frames_per_s"] = ms, sum(lengths) / (ms / 1e3)
    # The packed round's parts: its host staging alone (host time, the copy left in flight), and
    # the replay of inputs already staged (device time, no copy back), so packed_ms - replay_ms
    # is host work, copies and waits around the graph rather than the graph's own gaps.
    shape = steps.graphs.stage(slots, host)
    out["bucket"] = list(shape)
    out["replay_ms"] = median_ms(lambda: steps.graphs.replay(shape), steps.device, iters, warmup)
    # The same replay alone after an idle second (best of 3): against replay_ms, back to back,
    # what the GPU's sustained clock (power limit) costs a round rather than the graph's gaps.
    cold = []
    for _ in range(3 if steps.device.type == "cuda" else 0):
        time.sleep(1.0)
        sync(steps.device)
        start = time.perf_counter()
        steps.graphs.replay(shape)
        sync(steps.device)
        cold.append((time.perf_counter() - start) * 1e3)
    out["replay_after_idle_ms"] = min(cold) if cold else None
    stage_s = []
    for _ in range(iters):
        sync(steps.device)
        start = time.perf_counter()
        steps.graphs.stage(slots, host)
        stage_s.append(time.perf_counter() - start)
    out["stage_host_ms"] = statistics.median(stage_s) * 1e3
    return out


def offline(codec, device: torch.device, shape: tuple[int, int], iters: int, warmup: int) -> dict:
    rows, frames = shape
    codes = torch.stack(random_codes(rows, frames, codec.codebook_size, 4)).to(device)
    ms = median_ms(lambda: codec.decode(codes), device, iters, warmup)
    return {"rows": rows, "frames": frames, "ms": ms, "audio_s_per_s": rows * frames / FRAME_RATE / (ms / 1e3)}


def profile_step(steps: Steps, shape: tuple[int, int], codebook_size: int) -> dict:
    """Where one eager step's time goes: the top ops by device time (self), as printed text."""
    from torch.profiler import ProfilerActivity, profile

    rows, frames = shape
    codes = random_codes(rows, frames, codebook_size, seed=7)
    steps.reset(rows)
    steps.eager(list(range(rows)), codes)  # warm
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if steps.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        steps.eager(list(range(rows)), codes)
    key = "self_cuda_time_total" if steps.device.type == "cuda" else "self_cpu_time_total"
    text = prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=60)
    print(text, flush=True)
    return {"shape": f"{rows}x{frames}", "table": text}


def profile_round(steps: Steps, rows: int, codebook_size: int, seed: int = 11) -> dict:
    """Where a served round's time goes: one packed step of `rows` rows bringing 1..max_frames
    frames (the `rounds` section's mix), run uncaptured through the padded static-buffer path
    (the graphs' kernels and shapes, one launch each): GPU time per kernel name, as text."""
    from torch.profiler import ProfilerActivity, profile

    lengths, host = round_codes(rows, steps.graphs.max_frames, codebook_size, seed)
    slots = list(range(rows))
    steps.reset(rows)
    to_host(steps.padded.run(slots, host))  # warm
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        to_host(steps.padded.run(slots, host))
    events = prof.key_averages()
    text = events.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70)
    print(text, flush=True)
    total_ms = sum(e.self_device_time_total for e in events) / 1e3
    return {"rows": rows, "frames": sum(lengths), "kernel_ms": total_ms, "table": text}


def table(results: dict) -> str:
    meta = results["meta"]
    lines = [f"vocoder on {meta['device_name']} ({meta['codec']}, fusion {meta['fusion']}, ring kernel "
             f"{meta['ring_kernel']}, small-GEMM rows {meta.get('small_gemm_rows', 0)})"]
    if results.get("capture"):
        c = results["capture"]
        lines.append(f"capture: {c['graphs']} graphs in {c['seconds']:.1f} s, pool {c['pool_gib']:.2f} GiB "
                     f"(state {c['state_gib']:.2f} GiB)")
    lines.append(f"{'rows x frames':>14} {'eager ms':>9} {'graphed ms':>10} {'speedup':>7} "
                 f"{'eager aud-s/s':>13} {'graphed aud-s/s':>15}")
    for r in results.get("step", []):
        lines.append(f"{r['rows']:>9} x {r['frames']:<2} {r['eager_ms']:>9.2f} {r['graphed_ms']:>10.2f} "
                     f"{r['speedup']:>7.1f} {r['eager_audio_s_per_s']:>13.1f} {r['graphed_audio_s_per_s']:>15.1f}")
    if results.get("streaming"):
        st = results["streaming"]
        lines.append(f"streaming {st['rows']} rows in chunks {st['chunks']} vs offline decode: max |diff| / peak "
                     f"{st['max_rel_diff']:.3g}, finite {st['finite']}")
    for r in results.get("rounds", []):
        lines.append(f"round of {r['rows']} rows, {r['frames']} frames, {r['distinct_lengths']} lengths: packed "
                     f"{r['packed_ms']:.2f} ms ({r['packed_frames_per_s']:.0f} frames/s), one step per length "
                     f"{r['per_length_ms']:.2f} ms ({r['per_length_frames_per_s']:.0f} frames/s); packed parts: "
                     f"graph {r['bucket'][0]} x {r['bucket'][1]} replay {r['replay_ms']:.2f} ms, "
                     f"host staging {r['stage_host_ms']:.2f} ms"
                     + (f", one replay after an idle second {r['replay_after_idle_ms']:.2f} ms"
                        if r.get("replay_after_idle_ms") else ""))
    if results.get("offline"):
        o = results["offline"]
        lines.append(f"offline decode {o['rows']} x {o['frames']}: {o['ms']:.1f} ms, {o['audio_s_per_s']:.1f} audio-s/s")
    if results.get("fidelity"):
        f = results["fidelity"]
        lines.append(f"fidelity {f['rows']} x {f['frames']} ({f['fusion']}) vs the fp32 reference: max |diff| / peak "
                     f"{f['max_rel_diff']:.3g}, SNR {f['snr_db_min']:.1f} dB worst row ({f['snr_db_mean']:.1f} mean)")
    if results.get("ring_fidelity"):
        f = results["ring_fidelity"]
        lines.append(f"ring fidelity {f['rows']} x {f['frames']} ({f['ring_dtype']} rings) vs exact rings, streamed: "
                     f"max |diff| / peak {f['max_rel_diff']:.3g}, SNR {f['snr_db_min']:.1f} dB worst row")
    for r in results.get("attention_sweep", []):
        if r["streaming"]:
            p = r["packed_round"]
            split, fused = (_ms_text(r[key].get(r["default"])) for key in ("ms", "fused_ms"))
            lines.append(f"attention {r['heads']} heads, window {r['window']}, {r['tokens']} tokens x {r['rows']} rows "
                         f"at {r['default']}: split {split}, fused {fused}; packed round of {p['rows']} rows: split "
                         f"{p['split_ms']:.4f} ms, fused {p['fused_ms']:.4f} ms (fused runs: {p['fused_runs']})")
    for e in results.get("equivalence", []):
        lines.append(f"equivalence {e['rows']} x {e['frames']}: graphed == padded {e['graphed_equals_padded']}, "
                     f"graphed == eager {e['graphed_equals_eager']} (max diff {e['max_abs_diff_vs_eager']:.3g})")
    for name, err in results.get("errors", {}).items():
        lines.append(f"ERROR in {name}: {err.splitlines()[-1]}")
    return "\n".join(lines)


def _ms_text(ms) -> str:
    """A sweep's time (a float, or a config's failure text, or None where it did not run)."""
    return f"{ms:.4f} ms" if isinstance(ms, float) else str(ms)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write the results to")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny random codec in fp32 (smoke runs, CPU)")
    ap.add_argument("--shapes", default="1x2,16x10,64x10,256x10", help="rows x frames per step, comma-separated")
    ap.add_argument("--stream-rows", type=int, default=4, help="rows of the streaming == offline check")
    ap.add_argument("--offline", default="32x100", help="rows x frames of the offline decode")
    ap.add_argument("--rounds", default="16,64,128", help="rows of the mixed-length rounds, comma-separated")
    ap.add_argument("--max-graph-frames", type=int, default=10)
    ap.add_argument("--profile", default="", help="ROWSxFRAMES: also profile one eager step of that shape "
                    "(torch.profiler; the top CUDA kernels and ops go to the results)")
    ap.add_argument("--profile-round", type=int, default=0, help="ROWS: also profile one packed round of that "
                    "many rows (the rounds section's mix), uncaptured: GPU time per kernel")
    ap.add_argument("--attention-sweep", action="store_true", help="also time window_attention per stage "
                    "shape under several tile configs (CUDA only)")
    ap.add_argument("--fusion", default=DEFAULT_FUSION,
                    help="codec.serving_form_'s fusion (codec.transformer.FUSIONS; default: the one served)")
    ap.add_argument("--ring-kernel", choices=RING_KERNELS, default=DEFAULT_RING_KERNEL,
                    help="codec.serving_form_'s ring_kernel for every section: how streaming attention runs its "
                         "RoPE, attention and ring write (split: three kernels, fused: one; default: the one "
                         "served). The attention sweep times both either way")
    ap.add_argument("--ring-dtype", choices=RING_DTYPES, default=DEFAULT_RING_DTYPE,
                    help="codec.serving_form_'s ring_dtype for every section: how the decode state's rings store "
                         "keys and values (default auto: the codec's dtype, as served)")
    ap.add_argument("--ring-fidelity", default="", help="ROWSxFRAMES: also stream that many random codes with "
                    "--ring-dtype rings and with exact ones and compare the audio")
    ap.add_argument("--small-gemm-rows", type=int, default=0,
                    help="codec.serving_form_'s small_gemm_rows: steps of at most this many tokens at a stage run "
                         "each layer's GEMMs as kernels/fused_linear.py's (default 0: off, as served)")
    ap.add_argument("--gemm-table", type=Path, default=None,
                    help="a perf/bench_codec_gemm.py --sweep JSON: its tiles replace kernels/fused_linear.py's table "
                         "up to the rows it swept (bench_codec_gemm.table_with_sweep), for this run only")
    ap.add_argument("--fidelity", default="", help="ROWSxFRAMES: also decode that many random codes offline and "
                    "compare the audio with the fp32 reference of the same weights")
    ap.add_argument("--splitk", choices=("on", "off"), default="on",
                    help="off: no split-K in bf16 GEMMs (cuBLASLt, allow_bf16_reduced_precision_reduction = "
                         "(False, False): torch takes no other way): do the 1 x 2 step's split-K reduce kernels go?")
    ap.add_argument("--skip", default="", help="comma-separated sections not to run (e.g. offline,streaming)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    if args.ring_fidelity and args.ring_dtype == "auto":
        ap.error("--ring-fidelity compares --ring-dtype's rings with exact ones: give a --ring-dtype other than auto")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.gemm_table is not None:  # before any kernel runs: gemm_config reads the module's table
        from moss_tts.kernels import fused_linear
        from perf.bench_codec_gemm import table_with_sweep
        fused_linear.CONFIG_TABLE = table_with_sweep(json.loads(args.gemm_table.read_text()))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("moss_tts").setLevel(logging.INFO)  # the capture's one log line
    shapes = parse_shapes(args.shapes)
    if args.splitk == "off":  # torch takes allow_splitk=False only with the cuBLASLt backend
        torch.backends.cuda.preferred_blas_library("cublaslt")
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = (False, False)
    start = time.perf_counter()
    codec, device = build(args)
    results = {"meta": {"device": str(device), "torch": torch.__version__,
                        "stack": os.environ.get("MOSS_STACK", "unchecked (not under the device pack's env.sh)"),
                        # which tree's code ran: the pack's env.sh puts the directory it was sourced
                        # in first on every Python's path, whatever PYTHONPATH says (an A/B of two
                        # trees must source it in each; issue 34, sixth round)
                        "moss_tts": sys.modules["moss_tts"].__file__,
                        "fusion": args.fusion, "splitk": args.splitk,
                        "fusion_running": sorted({m.fusion for m in codec.modules() if hasattr(m, "fusion")}),
                        "ring_kernel": args.ring_kernel, "small_gemm_rows": args.small_gemm_rows,
                        "ring_dtype": args.ring_dtype,
                        "gemm_table": None if args.gemm_table is None else str(args.gemm_table),
                        "ring_kernel_running": sorted({m.ring_kernel for m in codec.modules()
                                                       if hasattr(m, "ring_kernel")}),
                        "small_gemm_rows_running": sorted({m.small_gemm_rows for m in codec.modules()
                                                           if hasattr(m, "small_gemm_rows")}),
                        "codec": "tiny fp32" if args.tiny else
                        "real-size bf16", "codec_build_s": time.perf_counter() - start,
                        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"},
               "errors": {}}
    # Rows for the largest of the step shapes, the rounds and the profiled round: sized by the
    # shapes alone, `--shapes 1x2 --rounds 256` dropped the round and the profile failed.
    round_rows = [int(x) for x in args.rounds.split(",") if x]
    steps = Steps(codec, device, max(*(r for r, _ in shapes), *round_rows, args.profile_round), args.max_graph_frames)
    size = codec.codebook_size
    sections = [
        ("capture", steps.capture),
        ("equivalence", lambda: equivalence(steps, shapes, size)),
        ("streaming", lambda: streaming(steps, min(args.stream_rows, steps.graphs.max_rows), size)),
        ("step", lambda: step_times(steps, shapes, size, args.iters, args.warmup)),
        ("rounds", lambda: [rounds(steps, n, size, args.iters, args.warmup) for n in round_rows]),
        ("offline", lambda: offline(codec, device, parse_shapes(args.offline)[0], max(3, args.iters // 4),
                                    args.warmup)),
    ]
    if args.fidelity:
        sections.append(("fidelity", lambda: fidelity(codec, args, device, parse_shapes(args.fidelity)[0])))
    if args.ring_fidelity:
        sections.append(("ring_fidelity", lambda: ring_fidelity(codec, device, parse_shapes(args.ring_fidelity)[0])))
    if args.attention_sweep and device.type == "cuda":
        sections.append(("attention_sweep", lambda: attention_sweep(device)))
    if args.profile:
        sections.append(("profile", lambda: profile_step(steps, parse_shapes(args.profile)[0], size)))
    if args.profile_round and device.type == "cuda":
        sections.append(("profile_round", lambda: profile_round(steps, args.profile_round, size)))
    skip = set(filter(None, args.skip.split(",")))
    for name, run in sections:
        if name in skip:
            continue
        try:
            results[name] = run()
        except Exception:  # keep the other sections' numbers
            results["errors"][name] = traceback.format_exc()
            print(results["errors"][name], file=sys.stderr, flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    print(table(results), flush=True)
    exact = all(e["graphed_equals_padded"] for e in results.get("equivalence", []))
    return 1 if results["errors"] or not exact else 0


if __name__ == "__main__":
    sys.exit(main())
