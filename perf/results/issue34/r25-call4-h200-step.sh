#!/usr/bin/env bash
# Round 25, call 4 (an H200 if one comes, the budget's last ~200 s; carry .device): the engine's graphed
# step at 256 slots with the exact cache and the fp8 one (FP8_CONFIG), the final code (no change since
# call 3). Round 24's H200 step was 7.90 / 7.91 ms; the target is 7.5.
set -uo pipefail
source perf/device_call.sh r25c4
call_setup
for kv in auto fp8_e4m3; do
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 80 python3 perf/bench_engine.py --batches 256 \
    --skip equivalence,offline,latency,probe,naive,prefix,fp32,split,profile --kv-cache-dtype $kv \
    --out "$R/engine_$kv" > "$R/engine_$kv.log" 2>&1
  echo "engine $kv: $(grep -E "decode step|ERROR" "$R/engine_$kv.log" | head -2 | cut -c1-160)"
  cp "$R/engine_$kv/bench.json" "$OUT/engine_$kv.json" 2>/dev/null
  call_mark "engine $kv"
done
