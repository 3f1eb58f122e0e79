#!/usr/bin/env bash
# Round 24, call 6 (an H200, needs_h200; carry .device; ~3 min, the budget's last minutes): the codec
# stage targets on the final code (1 x 2 step, 256 x 10 step, a packed round of 256 rows), last timed in
# round 18 before the quantizer's one-table decode (round 20, served, never timed on a GPU); and the
# profile of one packed round of 128 rows (vocoder_round_rows, the served round's most rows: round 24's
# 256-stream level ran ~470-frame rounds at ~40 µs a frame, against ~34 in a full 256-row round),
# to see where a served-size round's time goes before the next codec change.
set -uo pipefail
source perf/device_call.sh r24c6
call_setup
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout $(call_left ${END:-200}) python3 perf/bench_vocoder.py \
  --shapes 1x2,256x10 --rounds 128,256 --profile-round 128 --iters 10 --skip offline,streaming,equivalence \
  --out $OUT/stage_vocoder.json > $R/stage_vocoder.log 2>&1
grep -E "^ +[0-9]+ x|round of|Error" $R/stage_vocoder.log | cut -c1-200
cp $R/stage_vocoder.log $OUT/
call_mark "done"
