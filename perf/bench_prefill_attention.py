"""A batched prefill's per-layer work between its qkv GEMM and o_proj: the torch path against the
slot kernels (issue 34, thirteenth round).

    PYTHONPATH=python_backends:. python3 perf/bench_prefill_attention.py [--out x.json]

Round 13's served GPU trace (the 256-stream soak on an H200, GPU busy 99%) put ~17% of the engine
stream's time in a prefill's attention and its copies: per layer, two `index_select` gathers of
each prompt's key window (~13 µs each), two `repeat_interleave` copies for the query heads (~18
µs each) and PyTorch's memory-efficient SDPA with an additive mask (~32 µs). This times, at the
backbone's shape (32 query heads over 8 KV heads of 128, bf16, slot-major caches of 257 slots x
2,048 rows), for each launch shape:
  torch    what prefill_after ran before the kernel (gather the window, repeat per head, masked
           SDPA under the prefill's backends; the mask built once per launch, as there);
  kernel   kernels/prefill_attention.py for each PrefillConfig in a small grid.
Launch shapes (N prompts x T new rows per prompt, after a reused prefix of `start` rows):
  after_prefix  the soak's and the bench's: prompts of ~80 rows, 64 of them a reused prefix;
  clones        clone prompts: ~300 reused reference rows, ~30 new;
  from_row0     a plain prefill (no prefix): N x ~80 rows from row 0.
Each figure is the median of graph replays of 36 calls (one per layer, over 4 caches in turn), per
call. Then, per launch shape, the step before the attention (`qkv` rows): the compiled q/k RMSNorm +
RoPE (Fusions, as served) and two `index_put` writes against `step_qkv.prefill_qkv`. No model, no
engine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from moss_tts.engine.step import PREFILL_ATTENTION
from moss_tts.kernels import step_qkv
from moss_tts.kernels.fused import Fusions
from moss_tts.kernels.prefill_attention import DEFAULT_CONFIG, PrefillConfig, prefill_attention
from moss_tts.kernels.prefill_attention import reference_prefill_attention
from moss_tts.model.qwen3 import neox_rope
from perf.graph_timing import graph_ms

HEADS, KV_HEADS, HEAD_DIM, SLOTS, MAX_SEQ_LEN, LAYERS, CACHES = 32, 8, 128, 257, 2048, 36, 4

# name -> (prompts, new rows per launch (T, padded), reused rows: (low, high), new rows: (low, high))
SHAPES = {
    "after_prefix_n64": (64, 32, (64, 65), (8, 32)),
    "after_prefix_n128": (128, 16, (64, 65), (4, 16)),
    "clones_n16": (16, 48, (256, 385), (16, 48)),
    "from_row0_n48": (48, 96, (0, 1), (60, 96)),
}


def window_of(max_length: int) -> int:
    window = 128
    while window < max_length:
        window *= 2
    return window


def launch(shape, gen, device):
    n, t, (lo, hi), (new_lo, new_hi) = shape
    starts = torch.randint(lo, hi, (n,), generator=gen)
    new = torch.randint(new_lo, new_hi + 1, (n,), generator=gen).clamp(max=t)
    new[0] = t
    slots = torch.randperm(SLOTS - 1, generator=gen)[:n]
    q = torch.randn(n, t, HEADS, HEAD_DIM, generator=gen).to(device, torch.bfloat16)
    return q, slots.to(device), starts.to(device), (starts + new).to(device)


def torch_call(q, k, v, slots, starts, bias, window):
    """prefill_after's attention before the kernel (backbone.py, Qwen3Attention.attend, minus o_proj)."""
    keys = k[:, :window].index_select(0, slots)
    values = v[:, :window].index_select(0, slots)
    groups = HEADS // KV_HEADS
    with sdpa_kernel(PREFILL_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), keys.repeat_interleave(groups, dim=2).transpose(1, 2),
                                              values.repeat_interleave(groups, dim=2).transpose(1, 2), attn_mask=bias)


def time_qkv(q, slots, starts, caches, fusions) -> dict:
    """µs per layer: the compiled norm + RoPE and two index_put writes, against prefill_qkv."""
    n, t = q.shape[:2]
    gen = torch.Generator(device=q.device).manual_seed(1)
    qkv = torch.randn(n, t, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen, device=q.device, dtype=q.dtype)
    qw, kw = (1 + 0.1 * torch.randn(HEAD_DIM, generator=gen, device=q.device, dtype=q.dtype) for _ in range(2))
    positions = starts.unsqueeze(1) + torch.arange(t, device=q.device)
    rows = positions.clamp(max=MAX_SEQ_LEN - 1)
    cos, sin = neox_rope(positions, HEAD_DIM, 1e6, q.dtype)
    slot_rows = slots.unsqueeze(1).expand(n, t)

    def torch_path(i: int):
        k_cache, v_cache = caches[i % CACHES]
        a, b, c = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        qq, kk = fusions.qk_norm_rope(a.reshape(n, t, HEADS, HEAD_DIM), b.reshape(n, t, KV_HEADS, HEAD_DIM),
                                      qw, kw, 1e-6, cos, sin)
        k_cache.index_put_((slot_rows, rows), kk)
        v_cache.index_put_((slot_rows, rows), c.reshape(n, t, KV_HEADS, HEAD_DIM))
        return qq

    def kernel_path(i: int):
        k_cache, v_cache = caches[i % CACHES]
        return step_qkv.prefill_qkv(qkv, qw, kw, 1e-6, cos, sin, k_cache, v_cache, slots, rows, HEADS, KV_HEADS)

    k0, v0 = (c.clone() for c in caches[0])
    expected = torch_path(0).float()
    got = kernel_path(0).float()
    error = ((got - expected).abs().max() / expected.abs().max()).item()
    caches[0][0].copy_(k0)
    caches[0][1].copy_(v0)
    del k0, v0
    return {"torch_us": graph_ms(torch_path, LAYERS, 20) * 1e3, "kernel_us": graph_ms(kernel_path, LAYERS, 20) * 1e3,
            "kernel_relative_error": error}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--block-t", default="16,32")
    ap.add_argument("--block-n", default="32,64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    caches = [(torch.randn(SLOTS, MAX_SEQ_LEN, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16),
               torch.randn(SLOTS, MAX_SEQ_LEN, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16))
              for _ in range(CACHES)]
    results = {"meta": {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                        "default": str(DEFAULT_CONFIG)}, "runs": []}
    grid = list(itertools.product(*(map(int, a.split(",")) for a in (args.block_t, args.block_n, args.warps,
                                                                       args.stages))))
    for name in args.shapes.split(","):
        q, slots, starts, lengths = launch(SHAPES[name], gen, device)
        n, t = q.shape[:2]
        window = window_of(int(lengths.max()))
        positions = starts.unsqueeze(1) + torch.arange(t, device=device)
        allowed = torch.arange(window, device=device).view(1, 1, window) <= positions.unsqueeze(2)
        bias = torch.zeros(allowed.shape, device=device, dtype=q.dtype).masked_fill(
            ~allowed, torch.finfo(q.dtype).min).unsqueeze(1)
        # Agreement first (cache 0): the kernel's real rows against the fp32 reference.
        k, v = caches[0]
        expected = reference_prefill_attention(q.float(), k.float(), v.float(), slots, starts, lengths)
        got = prefill_attention(q, k, v, slots, starts, lengths)
        real = [(got[i, :e - s].float(), expected[i, :e - s]) for i, (s, e) in
                enumerate(zip(starts.tolist(), lengths.tolist()))]
        error = max(((g - e).abs().max() / e.abs().max()).item() for g, e in real)
        torch_us = graph_ms(lambda i: torch_call(q, *caches[i % CACHES], slots, starts, bias, window), LAYERS, 20) * 1e3
        base = {"shape": name, "prompts": n, "rows": t, "window": window, "new_rows": int((lengths - starts).sum()),
                "reused_rows": int(starts.sum()), "kernel_relative_error": error}
        results["runs"].append({**base, "path": "torch", "us_per_call": torch_us})
        print(f"{name:<18} N {n:<3} T {t:<3} window {window:<4} torch {torch_us:7.2f} µs  (kernel error {error:.2e})",
              flush=True)
        qkv = time_qkv(q, slots, starts, caches, Fusions.for_device(device, True))
        results["runs"].append({**base, "path": "qkv", **qkv})
        print(f"  qkv: torch (compiled norm + RoPE, 2 index_put) {qkv['torch_us']:7.2f} µs, prefill_qkv "
              f"{qkv['kernel_us']:7.2f} µs (error {qkv['kernel_relative_error']:.2e})", flush=True)
        for block_t, block_n, warps, stages in grid:
            config = PrefillConfig(block_t, block_n, warps, stages)
            try:
                us = graph_ms(lambda i: prefill_attention(q, *caches[i % CACHES], slots, starts, lengths,
                                                          config=config), LAYERS, 20) * 1e3
            except Exception as exc:  # e.g. out of shared memory
                print(f"  {config}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            run = {**base, "path": "kernel", "block_t": block_t, "block_n": block_n, "num_warps": warps,
                   "num_stages": stages, "us_per_call": us, "is_default": config == DEFAULT_CONFIG}
            results["runs"].append(run)
            print(f"  kernel block_t {block_t:<3} block_n {block_n:<3} warps {warps} stages {stages} {us:7.2f} µs"
                  f"{'  (default)' if run['is_default'] else ''}", flush=True)
    for name in args.shapes.split(","):
        runs = [r for r in results["runs"] if r["shape"] == name]
        kernels = [r for r in runs if r["path"] == "kernel"]
        if kernels:
            best = min(kernels, key=lambda r: r["us_per_call"])
            default = next((r["us_per_call"] for r in kernels if r["is_default"]), float("nan"))
            torch_us = next(r["us_per_call"] for r in runs if r["path"] == "torch")
            print(f"best {name}: block_t {best['block_t']} block_n {best['block_n']} warps {best['num_warps']} "
                  f"stages {best['num_stages']} {best['us_per_call']:.2f} µs; default {default:.2f}; torch {torch_us:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
