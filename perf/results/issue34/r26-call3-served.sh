#!/usr/bin/env bash
# Round 26, call 3 (an H200: needs_h200; carry .device; ~9.5 min), after r26-call2-int8.sh shows the
# int8 cache correct on a GPU: the served levels with each cache on one machine, the exact cache
# first, then int8, then the exact cache again (h200_scaling.sh ab: one server a variant), stream
# c=256 and c=128 and offline c=256, one run a level; the codec stage's H200 figures if time is left.
set -uo pipefail
source perf/device_call.sh r26c3
call_setup
call_ab 505 AB="auto:kv_cache_dtype=auto;int8:kv_cache_dtype=int8;auto2:kv_cache_dtype=auto" LEVELS=256,128 \
  MODE=stream,offline
call_mark "served"
if [ "$(call_left 590)" -ge 70 ]; then
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left 590)" python3 perf/bench_vocoder.py \
    --shapes 1x2,256x10 --rounds 256 --iters 10 --skip offline,streaming,equivalence \
    --out "$OUT/stage_vocoder.json" > "$R/stage_vocoder.log" 2>&1
  grep -E "^ +[0-9]+ x|round of|Error" "$R/stage_vocoder.log" | cut -c1-200
fi
call_mark "done"
