#!/usr/bin/env bash
# Round 21, call 2 (carry .device; ~9.5 min; any host). Round 21's call 1 (r20-call1.sh on a
# fresh H200) measured the small-GEMM path as provisioned LOSING: 1 x 2 graphed 5.46 ms at
# small_gemm_rows 64 against 3.90 ms at 0 (4 x 2: 5.43 against 4.65; 16 x 10 and the rounds level).
# This is round 20's prepared call 3 (its split-K GPU tests ran in call 1) with a profile added:
# do swept tiles (split-K included) win per GEMM, and does the path then win a step? No setup:
# nothing here reads the checkpoint.
# 1. bench_codec_gemm --sweep at 2-64 tokens: every candidate tile per codec GEMM, the served chain
#    beside them;
# 2. bench_vocoder with the swept table at small_gemm_rows 64 (with the profile of one eager 1 x 2
#    step) against 0, alternating, twice if time is left.
set -uo pipefail
source perf/device_call.sh r21c2
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 270 python3 perf/bench_codec_gemm.py --rows 2,4,8,16,32,64 \
  --reps 20 --iters 10 --sweep --out $R/codec_gemm_sweep_few_rows.json > $R/codec_gemm_sweep.log 2>&1
grep -A12 "^CONFIG_TABLE\|least summed" $R/codec_gemm_sweep.log | head -16
grep -E "residual|ffn0|in_proj" $R/codec_gemm_sweep.log | head -24 | cut -c1-130
call_mark "sweep done"
swept() { call_small_gemm_vocoder "$1" "swept_$2" --gemm-table "$R/codec_gemm_sweep_few_rows.json" "${@:3}"; }
swept 64 a --profile 1x2; swept 0 a
if [ "$(call_left 585)" -gt 100 ]; then swept 64 b; fi
if [ "$(call_left 585)" -gt 60 ]; then swept 0 b; fi
cp $R/codec_gemm_sweep_few_rows.json $R/codec_gemm_sweep.log $R/vocoder_sg*.json $OUT/ 2>/dev/null
call_mark "done"
