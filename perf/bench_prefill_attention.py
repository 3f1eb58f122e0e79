"""A batched prefill's per-layer work between its qkv GEMM and o_proj: the torch path against the
slot kernels (issue 34, thirteenth round).

    PYTHONPATH=python_backends:. python3 perf/bench_prefill_attention.py [--out x.json]

Round 13's served GPU trace (the 256-stream soak on an H200, GPU busy 99%) put ~17% of the engine
stream's time in a prefill's attention and its copies: per layer, two `index_select` gathers of
each prompt's key window (~13 µs each), two `repeat_interleave` copies for the query heads (~18
µs each) and PyTorch's memory-efficient SDPA with an additive mask (~32 µs). This times, at the
backbone's shape (32 query heads over 8 KV heads of 128, bf16, slot-major caches of 257 slots x
2,048 rows), for each launch shape:
  torch    what the engine ran before the kernel: after a reused prefix `prefill_after`'s (gather
           each prompt's window, repeat per head, masked SDPA under the prefill's backends; the
           mask built once per launch, as there), from row 0 `prefill`'s (the new rows' keys
           repeated per head, SDPA with the causal + padding mask);
  kernel   kernels/prefill_attention.py for each PrefillConfig in a small grid.
Launch shapes (N prompts x T new rows per prompt, after a reused prefix of `start` rows):
  after_prefix  the soak's and the bench's: prompts of ~80 rows, 64 of them a reused prefix;
  clones        clone prompts: ~300 reused reference rows, ~30 new;
  from_row0     a plain prefill (no prefix): N x ~80 rows from row 0.
Each figure is the median of graph replays of 36 calls (one per layer, over 4 caches in turn), per
call. Then, per launch shape, the step before the attention (`qkv` rows): the compiled q/k RMSNorm +
RoPE (Fusions, as served) and the cache writes (two `index_put`, or from row 0 `write_prompts`' two
`index_copy_`) against `step_qkv.prefill_qkv`. The JSON is rewritten after each shape, so a run cut
short keeps what it measured. No model, no engine.
"""

from __future__ import annotations

import argparse
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
from moss_tts.model.qwen3 import attention_bias, neox_rope
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
    return _sdpa(q, keys, values, bias)


def _sdpa(q, keys, values, bias):
    groups = HEADS // KV_HEADS
    with sdpa_kernel(PREFILL_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), keys.repeat_interleave(groups, dim=2).transpose(1, 2),
                                              values.repeat_interleave(groups, dim=2).transpose(1, 2), attn_mask=bias)


def torch_path_of(q, slots, starts, lengths, caches):
    """(the torch attention call per layer i, as the engine ran it for this launch)."""
    n, t = q.shape[:2]
    device = q.device
    if bool((starts == 0).all()):  # prefill from row 0: the new rows' own keys, no gather
        bias = attention_bias(torch.arange(t, device=device).unsqueeze(0) < lengths.unsqueeze(1), t, q.dtype)
        new = [(k.index_select(0, slots)[:, :t].contiguous(), v.index_select(0, slots)[:, :t].contiguous())
               for k, v in caches]
        return lambda i: _sdpa(q, *new[i % CACHES], bias)
    window = window_of(int(lengths.max()))
    positions = starts.unsqueeze(1) + torch.arange(t, device=device)
    allowed = torch.arange(window, device=device).view(1, 1, window) <= positions.unsqueeze(2)
    bias = torch.zeros(allowed.shape, device=device, dtype=q.dtype).masked_fill(
        ~allowed, torch.finfo(q.dtype).min).unsqueeze(1)
    return lambda i: torch_call(q, *caches[i % CACHES], slots, starts, bias, window)


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
    from_row0 = bool((starts == 0).all())

    def torch_path(i: int):
        k_cache, v_cache = caches[i % CACHES]
        a, b, c = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        qq, kk = fusions.qk_norm_rope(a.reshape(n, t, HEADS, HEAD_DIM), b.reshape(n, t, KV_HEADS, HEAD_DIM),
                                      qw, kw, 1e-6, cos, sin)
        if from_row0:  # StaticKVCache.write_prompts
            k_cache[:, :t].index_copy_(0, slots, kk)
            v_cache[:, :t].index_copy_(0, slots, c.reshape(n, t, KV_HEADS, HEAD_DIM))
        else:  # prefill_after's writes
            k_cache.index_put_((slot_rows, rows), kk)
            v_cache.index_put_((slot_rows, rows), c.reshape(n, t, KV_HEADS, HEAD_DIM))
        return qq

    def kernel_path(i: int):
        k_cache, v_cache = caches[i % CACHES]
        return step_qkv.prefill_qkv(qkv, qw, kw, 1e-6, cos, sin, k_cache, v_cache, slots, rows, HEADS, KV_HEADS)

    expected = torch_path(0).float()  # q only: the cache writes are the GPU tests' (test_step_qkv)
    got = kernel_path(0).float()
    error = ((got - expected).abs().max() / expected.abs().max()).item()
    return {"torch_us": graph_ms(torch_path, LAYERS, 20) * 1e3, "kernel_us": graph_ms(kernel_path, LAYERS, 20) * 1e3,
            "kernel_relative_error": error}


# The launch shapes of the kernel swept (block_t:block_n:warps:stages): 32-row blocks on 8 warps
# only (on 4 their accumulator spills: tests/test_kernel_compile.py); the default first.
CONFIGS = "16:32:4:2,16:64:4:2,16:64:4:3,16:128:8:2,32:64:8:2,32:32:8:3"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--configs", default=CONFIGS, help="block_t:block_n:warps:stages,...")
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
    configs = [PrefillConfig(*map(int, c.split(":"))) for c in args.configs.split(",")]
    fusions = Fusions.for_device(device, True)
    for name in args.shapes.split(","):
        q, slots, starts, lengths = launch(SHAPES[name], gen, device)
        n, t = q.shape[:2]
        # Agreement first (cache 0): the kernel's real rows against the fp32 reference.
        k, v = caches[0]
        expected = reference_prefill_attention(q.float(), k.float(), v.float(), slots, starts, lengths)
        got = prefill_attention(q, k, v, slots, starts, lengths)
        real = [(got[i, :e - s].float(), expected[i, :e - s]) for i, (s, e) in
                enumerate(zip(starts.tolist(), lengths.tolist()))]
        error = max(((g - e).abs().max() / e.abs().max()).item() for g, e in real)
        torch_us = graph_ms(torch_path_of(q, slots, starts, lengths, caches), LAYERS, 20) * 1e3
        base = {"shape": name, "prompts": n, "rows": t, "window": window_of(int(lengths.max())),
                "new_rows": int((lengths - starts).sum()), "reused_rows": int(starts.sum()),
                "kernel_relative_error": error}
        results["runs"].append({**base, "path": "torch", "us_per_call": torch_us})
        print(f"{name}: N {n} T {t}: attention torch {torch_us:.2f} µs a layer (kernel error {error:.2e})", flush=True)
        qkv = time_qkv(q, slots, starts, caches, fusions)
        results["runs"].append({**base, "path": "qkv", **qkv})
        print(f"{name}: qkv torch (compiled norm + RoPE, cache writes) {qkv['torch_us']:.2f} µs, prefill_qkv "
              f"{qkv['kernel_us']:.2f} µs (error {qkv['kernel_relative_error']:.2e})", flush=True)
        for config in configs:
            try:
                us = graph_ms(lambda i: prefill_attention(q, *caches[i % CACHES], slots, starts, lengths,
                                                          config=config), LAYERS, 20) * 1e3
            except Exception as exc:  # e.g. out of shared memory
                print(f"{name}: {config}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                continue
            run = {**base, "path": "kernel", "block_t": config.block_t, "block_n": config.block_n,
                   "num_warps": config.num_warps, "num_stages": config.num_stages, "us_per_call": us,
                   "is_default": config == DEFAULT_CONFIG}
            results["runs"].append(run)
            print(f"{name}: kernel {config.block_t}:{config.block_n}:{config.num_warps}:{config.num_stages} "
                  f"{us:.2f} µs{'  (default)' if run['is_default'] else ''}", flush=True)
        if args.out:  # after each shape: a run cut short keeps what it measured
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
