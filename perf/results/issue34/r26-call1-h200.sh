#!/usr/bin/env bash
# Prepared in round 25 for the next H200 (needs_h200; carry .device; ~9.5 min). Round 25 got no H200:
# 1. the engine's graphed step at 256 slots, exact and fp8 caches (does fp8 pass 7.5 ms on an H200?);
# 2. the codec stage figures on an H200 (r24-call6-codec.sh's bench: 1 x 2, 256 x 10, packed rounds
#    of 128 and 256 rows, the 128-row round profiled);
# 3. the served 256-stream level, one server per cache (h200_scaling.sh ab), with what time is left.
set -uo pipefail
source perf/device_call.sh r26c1
call_setup
call_engine_step heads auto 130 --kv-cache-dtype auto
call_engine_step heads fp8 200 --kv-cache-dtype fp8_e4m3
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout $(call_left 330) python3 perf/bench_vocoder.py \
  --shapes 1x2,256x10 --rounds 128,256 --profile-round 128 --iters 10 --skip offline,streaming,equivalence \
  --out $OUT/stage_vocoder.json > $R/stage_vocoder.log 2>&1
grep -E "^ +[0-9]+ x|round of|Error" $R/stage_vocoder.log | cut -c1-200
call_mark "codec"
if [ "$(call_left ${END:-590})" -ge 250 ]; then
  call_ab "${END:-590}" AB="auto:kv_cache_dtype=auto;fp8:kv_cache_dtype=fp8_e4m3" LEVELS=256 MODE=stream
fi
call_mark "done"
