#!/usr/bin/env bash
# Round 24, call 6 (an H200, needs_h200; carry .device; ~2.5 min, the budget's last minutes): the codec
# stage targets on the final code (1 x 2 step, 256 x 10 step, a packed round of 256 rows), last timed in
# round 18 before the quantizer's one-table decode (round 20, served, never timed on a GPU).
set -uo pipefail
source perf/device_call.sh r24c6
call_setup
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout $(call_left ${END:-200}) python3 perf/bench_vocoder.py \
  --shapes 1x2,256x10 --rounds 256 --iters 10 --skip offline,streaming,equivalence \
  --out $OUT/stage_vocoder.json > $R/stage_vocoder.log 2>&1
grep -E "^ +[0-9]+ x|round of|Error" $R/stage_vocoder.log | cut -c1-200
cp $R/stage_vocoder.log $OUT/
call_mark "done"
