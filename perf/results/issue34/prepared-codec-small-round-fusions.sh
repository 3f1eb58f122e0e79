#!/usr/bin/env bash
# Prepared in round 12, not yet run (round 13 ran its prefill kernel instead; no carry: torch and this tree, no
# tritonserver; ~5 min): the codec's small rounds under each fusion. A round costs ~4.5 ms
# however small (round 12, bench_overlap: 1x2 4.71 ms, 12x10 7.72), ~1,100 graph nodes, and the
# soak's rounds carry ~120 frames; the fusions were measured at 256 x 10 and the large rounds only
# (round 1: the Triton GEMM's LayerNorm prologue 0.27-0.45x the unfused chain there). Do the
# fewer kernels of `norm_gelu` / `gelu` (no LayerNorm or GELU pass of their own) pay at 1-64
# tokens a stage? If one wins below some bucket, the codec can take its fusion per graph bucket.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
for f in ln_lt_gelu norm_gelu gelu lt_gelu none; do
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 110 python3 perf/bench_vocoder.py --fusion $f \
    --shapes 1x2,4x2,16x10 --rounds 16 --iters 20 --skip offline,streaming,equivalence \
    --out "$OUT/r13-small-rounds-$f.json" 2>&1 | grep -E " x |round|ERROR" | head -8 | sed "s/^/$f: /"
done
