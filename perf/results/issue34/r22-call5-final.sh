#!/usr/bin/env bash
# Round 22, call 5 (carry .device; <= 290 s: the budget's last minutes): the final code (heads-first
# decode grid served, the L2 prefetch removed) on a fresh call. The GPU tests of the decode
# attention (the served grid == the slot-major grid bit for bit), the engine (graphed == eager) and
# the codec's serving form; then the engine step at 256 in the served order and the old one,
# alternating while time is left.
set -uo pipefail
source perf/device_call.sh r22c5
call_gpu_tests decode_attention gpu_engine
engine() {  # ORDER LABEL
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left 290)" python3 perf/bench_engine.py --batches 256 \
    --skip equivalence,offline,latency,probe,naive,prefix,fp32,split,profile --decode-order "$1" \
    --out $R/engine_$1_$2 > $R/engine_$1_$2.log 2>&1
  echo "engine $1 $2: $(grep -E "decode step|ERROR" $R/engine_$1_$2.log | head -2 | cut -c1-160)"
  cp $R/engine_$1_$2/bench.json $OUT/engine_$1_$2.json 2>/dev/null
  call_mark "engine $1 $2"
}
engine heads a
if [ "$(call_left 290)" -gt 40 ]; then call_served_codec_gpu_tests; fi
if [ "$(call_left 290)" -gt 60 ]; then engine slots a; fi
call_mark "done"
