#!/usr/bin/env bash
# Round 20, call 3 (prepared in round 20, not yet run; carry .device; ~9 min; any host; after
# r20-call2.sh, or instead of it when its profile showed the small-GEMM path losing in its GEMMs).
# The table's few-row tiles are provisional (chosen from sm_90 compiles, never timed). So:
# 1. bench_codec_gemm --sweep at 2-64 tokens: every candidate tile of the two codec stage shapes and
#    the four GEMMs of a layer, split-K included (GemmConfig.split_k: the residual GEMMs' N = d
#    leaves 24-80 programs of 16 x 32 tiles, against cuBLAS's split-K); prints the best table;
# 2. the split-K GPU tests (determinism over 20 calls, accuracy against addmm_);
# 3. bench_vocoder with that table (--gemm-table: only rows <= 64 change) at small_gemm_rows 64,
#    against 0 (the served path), alternating, twice if time is left.
set -uo pipefail
source perf/device_call.sh r20c3
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 270 python3 perf/bench_codec_gemm.py --rows 2,4,8,16,32,64 \
  --reps 20 --iters 10 --sweep --out $R/codec_gemm_sweep_few_rows.json > $R/codec_gemm_sweep.log 2>&1
grep -A12 "^CONFIG_TABLE\|least summed" $R/codec_gemm_sweep.log | head -16
grep -E "residual|ffn0|in_proj" $R/codec_gemm_sweep.log | head -24 | cut -c1-130
call_mark "sweep done"
PYTHONPATH=python_backends:tests:. timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused_linear.py \
  -k "split_k or residual" > $R/gpu_tests_split_k.txt 2>&1
echo "gpu tests split-K / residual: $(tail -1 $R/gpu_tests_split_k.txt)"
swept() { call_small_gemm_vocoder "$1" "swept_$2" --gemm-table "$R/codec_gemm_sweep_few_rows.json"; }
swept 64 a; swept 0 a
if [ "$(call_left 585)" -gt 150 ]; then swept 64 b; fi
if [ "$(call_left 585)" -gt 150 ]; then swept 0 b; fi
cp $R/codec_gemm_sweep_few_rows.json $R/vocoder_sg*.json $OUT/ 2>/dev/null
