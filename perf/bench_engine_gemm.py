"""The engine's decode GEMMs alone, per BLAS back end and reduction setting (issue 34).

    PYTHONPATH=python_backends:. python3 perf/bench_engine_gemm.py --out gemm.json    # H200, ~30 s

A decode step at batch M runs, per backbone layer (Qwen3-4B: hidden 2560, 32 q / 8 kv heads of
128, intermediate 9728), four bf16 GEMMs: qkv [M, 2560] x [6144, 2560]^T, o [M, 4096] x
[2560, 4096]^T, gate/up [M, 2560] x [19456, 2560]^T, down [M, 9728] x [2560, 9728]^T; the local
frame's (width 2560, inner 9728) run 12-13 times a step. cuBLAS picks a kernel per shape by
heuristics (the graphed step's profile: down runs split-K plus a reduction kernel, 27 us a layer
where its bytes and FLOPs need ~17). Each row times F.linear under torch's default back end,
under cuBLASLt (`torch.backends.cuda.preferred_blas_library`), and with bf16 reduced-precision
reduction off, by graph replays; every call reads its own weight copy (>= 128 MiB in rotation), so
weights come from HBM as in the step, not from L2.

--triton (issue 34, round 24): also times kernels/fused_linear.py's plain GEMM at every shape over
TRITON_SWEEP's tiles (split-K summed in the kernel by the last program to arrive, no reduce
kernel), with W prepared N-contiguous as the codec serves it, and prints per shape the best tile
against cuBLAS. The question: do the N = 2560 projections (o, down, local_out: 40 output tiles of
128 x 128 at M = 256, ~450 TFLOP/s under cuBLAS where qkv and gate_up reach 550-630) run faster
with more programs sharing K? Each row also carries the largest |triton - cuBLAS| relative to
max |cuBLAS|.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from moss_tts.kernels.fused_linear import GemmConfig, fused_linear, prepare_weight
from perf.graph_timing import graph_ms

SHAPES = {  # name -> (K, N)
    "qkv": (2560, 6144), "o": (4096, 2560), "gate_up": (2560, 19456), "down": (9728, 2560),
    "local_qkv": (2560, 7680), "local_in": (2560, 9728), "local_out": (9728, 2560),
}
ROTATION_BYTES = 128 << 20
# Tiles for M = 128-256: the wide tile cuBLAS-like kernels use, narrower ones for more programs, and
# split-K at 2-6 shares so that N = 2560's 40 (or 20) output tiles become ~80-160 programs.
TRITON_SWEEP = tuple(GemmConfig(bm, bn, bk, w, st, split_k=sk) for bm, bn, bk, w, st, sk in (
    (128, 128, 64, 8, 3, 1), (128, 128, 64, 8, 4, 1), (128, 128, 64, 8, 4, 2), (128, 128, 64, 8, 4, 3),
    (128, 128, 64, 8, 4, 4), (128, 256, 64, 8, 3, 1), (128, 256, 64, 8, 3, 3), (128, 256, 64, 8, 3, 6),
    (64, 128, 64, 4, 4, 1), (64, 128, 64, 4, 4, 2), (128, 64, 64, 4, 4, 1), (128, 64, 64, 4, 4, 2),
    (128, 64, 64, 4, 4, 3), (64, 64, 128, 4, 4, 2), (64, 256, 64, 4, 3, 1), (64, 256, 64, 4, 3, 2)))


def operands(m: int, k: int, n: int, device: torch.device, prepare: bool = False):
    """(copies, weights, xs): enough bf16 copies of W [N, K] (N-contiguous with `prepare`, as
    fused_linear serves it) and x [M, K] that one graph's calls rotate over >= ROTATION_BYTES of
    weights, so each call reads its W from HBM; cuBLAS and Triton rows share the rule."""
    copies = max(2, -(-ROTATION_BYTES // (k * n * 2)))
    weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    xs = [torch.randn(m, k, device=device, dtype=torch.bfloat16) for _ in range(copies)]
    return copies, [prepare_weight(w) for w in weights] if prepare else weights, xs


def time_linear(m: int, k: int, n: int, device: torch.device) -> float:
    copies, weights, xs = operands(m, k, n, device)
    return graph_ms(lambda i: F.linear(xs[i % copies], weights[i % copies]), reps=copies * 4, iters=10)


def time_triton(m: int, k: int, n: int, device: torch.device) -> list[dict]:
    """fused_linear (plain) at each TRITON_SWEEP tile: [{config, us, tflops, rel_diff}]."""
    copies, weights, xs = operands(m, k, n, device, prepare=True)
    expected = F.linear(xs[0], weights[0]).float()
    rows = []
    for config in TRITON_SWEEP:
        try:
            got = fused_linear(xs[0], weights[0], config=config).float()
            ms = graph_ms(lambda i, c=config: fused_linear(xs[i % copies], weights[i % copies], config=c),
                          reps=copies * 4, iters=10)
        except Exception as exc:  # a tile that does not compile (shared memory) is a row, not the end
            rows.append({"config": str(config), "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            continue
        rows.append({"config": str(config), "us": ms * 1e3, "tflops": 2 * m * k * n / (ms / 1e3) / 1e12,
                     "rel_diff": ((got - expected).abs().max() / expected.abs().max()).item()})
    return rows


def settings():
    """(name, apply) pairs; each apply sets torch's global BLAS state for the rows after it."""
    matmul = torch.backends.cuda.matmul

    def default():
        torch.backends.cuda.preferred_blas_library("cublas")
        matmul.allow_bf16_reduced_precision_reduction = True

    def lt():
        torch.backends.cuda.preferred_blas_library("cublaslt")
        matmul.allow_bf16_reduced_precision_reduction = True

    def no_reduced():
        torch.backends.cuda.preferred_blas_library("cublas")
        matmul.allow_bf16_reduced_precision_reduction = False

    return [("cublas", default), ("cublaslt", lt), ("cublas_fp32_reduce", no_reduced)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="128,256")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--triton", action="store_true", help="also sweep fused_linear's tiles at every shape")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    rows = []
    for name, apply in settings():
        apply()
        for m in (int(x) for x in args.batches.split(",")):
            for shape, (k, n) in SHAPES.items():
                ms = time_linear(m, k, n, device)
                rows.append({"setting": name, "m": m, "gemm": shape, "k": k, "n": n, "us": ms * 1e3,
                             "tflops": 2 * m * k * n / (ms / 1e3) / 1e12})
                print(f"{name:>18} M {m:>4} {shape:>9} [{k} -> {n}]: {ms * 1e3:7.2f} us "
                      f"{rows[-1]['tflops']:6.1f} TFLOP/s", flush=True)
    settings()[0][1]()
    triton_rows = []
    for m in (int(x) for x in args.batches.split(",")) if args.triton else ():
        for shape, (k, n) in SHAPES.items():
            swept = time_triton(m, k, n, device)
            triton_rows.append({"m": m, "gemm": shape, "k": k, "n": n, "tiles": swept})
            cublas = next(r["us"] for r in rows if r["setting"] == "cublas" and r["m"] == m and r["gemm"] == shape)
            timed = [t for t in swept if "us" in t]
            best = min(timed, key=lambda t: t["us"]) if timed else None
            print(f"{'triton best':>18} M {m:>4} {shape:>9} [{k} -> {n}]: "
                  + (f"{best['us']:7.2f} us {best['tflops']:6.1f} TFLOP/s ({best['config']}, rel diff "
                     f"{best['rel_diff']:.1e}) against cuBLAS {cublas:.2f} us" if best else "no tile ran"), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                                        "rows": rows, "triton": triton_rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
