#!/usr/bin/env bash
# Round 24, call 2 (any GPU, H100 if no H200 comes; carry .device; ~2-3 min): the engine's decode
# GEMMs under cuBLAS against kernels/fused_linear.py's tiles (bench_engine_gemm.py --triton; no
# checkpoint needed). Does split-K summed in the kernel beat cuBLAS at the N = 2560 projections (o,
# down, local_out) at M = 256, where cuBLAS reads ~450 TFLOP/s? Triton against cuBLAS on one chip.
set -uo pipefail
source perf/device_call.sh r24c2
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout $(call_left 570) python3 perf/bench_engine_gemm.py \
  --batches 256,128 --triton --out $OUT/engine_gemm.json > $R/engine_gemm.log 2>&1
grep -E "^ +cublas .*M  256|triton best|Error" $R/engine_gemm.log | cut -c1-170
cp $R/engine_gemm.log $OUT/
call_mark "done"
