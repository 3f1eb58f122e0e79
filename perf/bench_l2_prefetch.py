"""Does kernels/l2_prefetch.py put a weight in L2, and what does a codec GEMM gain from it? (issue 34)

    PYTHONPATH=python_backends:. python3 perf/bench_l2_prefetch.py [--out x.json]

For each GEMM shape of a codec layer at a few-token step (x [M, K] @ W^T, bf16, W [N, K] as
nn.Linear stores it), the GEMM's device time (CUDA events around it alone, median of `--iters`)
in three states of the L2:
  cold       after a 256 MB write has evicted everything (how a served step meets its weights);
  prefetched cold, then `l2_prefetch.prefetch(W)` and a synchronize, then the GEMM;
  settled    the same with ~20 µs of GPU spin (torch.cuda._sleep) between prefetch and GEMM: a
             bulk prefetch is fire-and-forget, so its kernel may end before its bytes arrive;
  warm       the same GEMM run just before (the most the L2 can give);
and the prefetch kernel's own time from cold (issuing, not the transfer). Prefetched or settled
near warm means the bytes land in L2; near cold means they do not. A sanity figure for codec/weight_prefetch.py,
which overlaps the prefetch with the GEMM before instead of synchronizing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from moss_tts.kernels import l2_prefetch

# (name, N, K): the codec's stage widths 1280 and 768 (perf/bench_codec_gemm.py)
SHAPES = [(f"d{d} {name}", n, k) for d in (1280, 768)
          for name, n, k in (("in_proj", 3 * d, d), ("out_proj", d, d), ("ffn0", 4 * d, d), ("ffn2", d, 4 * d))]
FLUSH_BYTES = 256 << 20


def timed(fn, before) -> float:
    """µs of fn alone on the device, after before() and a synchronize."""
    before()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="2,16,64", help="tokens M, comma-separated")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    cold = lambda: flush.fill_(1)  # noqa: E731
    results = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "chunk_bytes": l2_prefetch.CHUNK_BYTES, "programs": l2_prefetch.NUM_PROGRAMS}, "runs": []}
    for name, n, k in SHAPES:
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
        if not l2_prefetch.is_supported(w):
            print(f"{name}: no bulk prefetch on this device", file=sys.stderr)
            return 2
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            gemm = lambda: torch.mm(x, w.t())  # noqa: E731
            gemm()
            runs = {"cold": [], "prefetched": [], "settled": [], "warm": [], "prefetch_kernel": []}
            for _ in range(args.iters):
                runs["cold"].append(timed(gemm, cold))
                runs["prefetched"].append(timed(gemm, lambda: (cold(), l2_prefetch.prefetch(w))))
                spin = lambda: (cold(), l2_prefetch.prefetch(w), torch.cuda._sleep(40_000))  # noqa: E731
                runs["settled"].append(timed(gemm, spin))
                runs["warm"].append(timed(gemm, gemm))
                runs["prefetch_kernel"].append(timed(lambda: l2_prefetch.prefetch(w), cold))
            row = {"shape": name, "n": n, "k": k, "m": m, "mbytes": w.numel() * 2 / 1e6,
                   **{f"{key}_us": statistics.median(v) for key, v in runs.items()}}
            results["runs"].append(row)
            print(f"{name:<14} M {m:<3} {row['mbytes']:5.1f} MB  cold {row['cold_us']:6.1f} µs  prefetched "
                  f"{row['prefetched_us']:6.1f}  settled {row['settled_us']:6.1f}  warm {row['warm_us']:6.1f}  "
                  f"prefetch kernel {row['prefetch_kernel_us']:6.1f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
