"""The engine's decode attention alone, swept over its launch shapes (issue 34, eighth round).

    PYTHONPATH=python_backends:. python3 perf/bench_decode_attention.py [--out x.json]

The decode step's attention took 2.22 ms of a 7.77 ms step at batch 256 (round 5's graph profile):
61.8 µs a layer, ~3.7 TB/s over the cache rows it reads, of the H200's ~4.8. This times
`kernels.decode_attention` at the backbone's shape (32 query heads over 8 KV heads of 128, bf16,
slot-major caches of max_seq_len 2048 rows; or fp8 ones, --kv-cache-dtype) for each `DecodeConfig` in a grid (keys per tile, warps,
pipeline stages, forced splits, grid order: slot-major or `heads_first`), on two length mixes:
  bench_engine   slot s at 150 + s x 134 / S rows (bench_engine.py's batch-256 step: mean ~217)
  served         94 + a uniform 0..112 frames (the served bench: 94 prompt rows, 112 frames)
Each figure is the median of graph replays of 36 calls (one per layer, over 4 caches in turn so
the L2 cache holds none of a call's rows), per call; GB/s counts the K and V rows read once.
No model, no engine: the kernel and its launch only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch

from moss_tts.kernels import kv_format
from moss_tts.kernels.decode_attention import DEFAULT_CONFIG, FP8_CONFIG, INT8_CONFIG, DecodeConfig, decode_attention
from perf.graph_timing import graph_ms

HEADS, KV_HEADS, HEAD_DIM, MAX_SEQ_LEN, LAYERS, CACHES = 32, 8, 128, 2048, 36, 4


def lengths_of(mix: str, slots: int, gen: torch.Generator) -> torch.Tensor:
    if mix == "bench_engine":
        return 150 + torch.arange(slots) * 134 // slots
    return 94 + torch.randint(0, 113, (slots,), generator=gen)


def window_of(max_length: int) -> int:
    """The engine's decode window for it: 256, doubling (engine/buckets.py, MIN_KV_BUCKET)."""
    window = 256
    while window < max_length:
        window *= 2
    return window


def time_config(q, caches, lengths, window, config, num_splits, iters=20) -> float:
    """µs per call: the median of `iters` replays of a graph of LAYERS calls (perf/graph_timing)."""
    def call(layer: int):
        k, v, scales = caches[layer % CACHES]
        decode_attention(q, k, v, lengths, window, num_splits=num_splits, config=config, kv_scales=scales)
    return graph_ms(call, LAYERS, iters) * 1e3


def cache_pair(batch: int, cache_dtype: torch.dtype, device) -> tuple:
    """(k, v, kv_scales) of random rows stored as a cache of `cache_dtype` stores them (StaticKVCache's layout)."""
    stored = [kv_format.split_rows(kv_format.to_rows(torch.randn(batch + 1, MAX_SEQ_LEN, KV_HEADS, HEAD_DIM,
                                                                 device=device, dtype=torch.bfloat16), cache_dtype),
                                   KV_HEADS, HEAD_DIM) for _ in range(2)]
    (k, k_scale), (v, v_scale) = stored
    return k, v, (k_scale, v_scale) if k_scale is not None else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--batches", default="256,128")
    ap.add_argument("--blocks", default="32,64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2,3,4")
    ap.add_argument("--splits", default="0,2", help="forced split counts; 0 = the plan's own")
    ap.add_argument("--orders", default="slots,heads", help="grid orders: slots (the default) and/or heads "
                    "(DecodeConfig.heads_first)")
    ap.add_argument("--fp16-dots", default="0", help="DecodeConfig.fp16_dots values (0,1; fp8 and int8 caches only)")
    ap.add_argument("--kv-cache-dtype", choices=kv_format.KV_CACHE_DTYPES, default="auto",
                    help="the caches' dtype (EngineConfig.kv_cache_dtype); fp8's default is FP8_CONFIG, "
                    "int8's INT8_CONFIG")
    args = ap.parse_args(argv)
    cache_dtype = kv_format.cache_dtype(args.kv_cache_dtype, torch.bfloat16)
    default = (INT8_CONFIG if kv_format.is_scaled(cache_dtype) else FP8_CONFIG if kv_format.is_fp8(cache_dtype)
               else DEFAULT_CONFIG)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    results = {"meta": {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                        "default": str(default), "kv_cache_dtype": args.kv_cache_dtype},
               "runs": []}
    grid = list(itertools.product(*(map(int, a.split(",")) for a in (args.blocks, args.warps, args.stages)),
                                  [order == "heads" for order in args.orders.split(",")],
                                  [bool(int(x)) for x in args.fp16_dots.split(",")]))
    splits = [int(s) or None for s in args.splits.split(",")]
    for batch in map(int, args.batches.split(",")):
        caches = [cache_pair(batch, cache_dtype, device) for _ in range(CACHES)]
        q = torch.randn(batch, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
        for mix in ("bench_engine", "served"):
            lengths = lengths_of(mix, batch, gen)
            window = window_of(int(lengths.max()) + 1)
            rows_read = int(lengths.sum())
            bytes_per_call = rows_read * kv_format.row_elements(KV_HEADS, HEAD_DIM, cache_dtype) * 2 \
                * cache_dtype.itemsize  # K and V (int8: and their scales)
            lengths = lengths.to(device)
            for (block, warps, stages, heads_first, fp16_dots), forced in itertools.product(grid, splits):
                config = DecodeConfig(block_n=block, num_warps=warps, num_stages=stages, heads_first=heads_first,
                                      fp16_dots=fp16_dots)
                try:
                    us = time_config(q, caches, lengths, window, config, forced)
                except Exception as exc:  # e.g. out of shared memory for a deep pipeline
                    print(f"b{batch} {mix} {config} splits {forced}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                run = {"batch": batch, "mix": mix, "window": window, "mean_rows": rows_read / batch,
                       "block_n": block, "num_warps": warps, "num_stages": stages, "splits": forced or 0,
                       "heads_first": heads_first, "fp16_dots": fp16_dots,
                       "us_per_call": us, "tb_per_s": bytes_per_call / us / 1e6,
                       "is_default": config == default and forced is None}
                results["runs"].append(run)
                order = "heads" if heads_first else "slots"
                print(f"b{batch:<4} {mix:<12} window {window:<4} block {block:<3} warps {warps} stages {stages} "
                      f"splits {forced or 'plan':<4} {order}{' fp16' if fp16_dots else ''} {us:7.2f} µs  {run['tb_per_s']:.2f} TB/s"
                      f"{'  (default)' if run['is_default'] else ''}", flush=True)
        del caches
        torch.cuda.empty_cache()
    for batch in map(int, args.batches.split(",")):
        for mix in ("bench_engine", "served"):
            runs = [r for r in results["runs"] if r["batch"] == batch and r["mix"] == mix]
            if runs:
                best = min(runs, key=lambda r: r["us_per_call"])
                default_us = next((r["us_per_call"] for r in runs if r["is_default"]), float("nan"))
                order = "heads" if best["heads_first"] else "slots"
                print(f"best b{batch} {mix}: block {best['block_n']} warps {best['num_warps']} stages "
                      f"{best['num_stages']} splits {best['splits'] or 'plan'} {order} first"
                      f"{', fp16 dots' if best['fp16_dots'] else ''}: "
                      f"{best['us_per_call']:.2f} µs ({best['tb_per_s']:.2f} TB/s); default {default_us:.2f} µs")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
