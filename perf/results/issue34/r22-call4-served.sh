#!/usr/bin/env bash
# Round 22, call 4 (prepared, NOT RUN: no H200 came; carry .device; ~7 min; an H200). Call 2
# (r22-call2-attention.sh) measured the decode attention's heads-first grid faster (H100) and it is
# the served default since 7a86e20. Its GPU tests and the engine's beside the setup, then the served
# levels on this code (stream 1, 128, 256 and offline 256, twice), for the figures beside round
# 17's.
set -uo pipefail
source perf/device_call.sh r22c4
call_setup &
SETUP=$!
call_gpu_tests decode_attention gpu_engine
wait $SETUP
REPEAT=2 LEVELS=1,128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
  timeout $(call_left 580) bash perf/h200_scaling.sh layout single 2>&1 | tail -4
call_mark "levels done"
call_levels
cp $W/results/bench_single_*.json $OUT/ 2>/dev/null
