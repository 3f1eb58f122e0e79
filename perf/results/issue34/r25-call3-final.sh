#!/usr/bin/env bash
# Round 25, call 3 (the last; a fresh machine after the last code change; carry .device; <= ~9 min):
# the fp8 KV cache with its own tile (FP8_CONFIG: 3 stages, fp16 dots, from call 2's sweep).
# 1. GPU tests: kv_fp8, decode_attention, step_qkv, gpu_engine (graphed == eager on fp8 too);
# 2. the engine's graphed step at 256: auto, fp8, fp8, auto;
# 3. perf/bench_kv_fidelity.py (bf16 with each cache against fp32);
# 4. with >= 270 s left: the served 256-stream level, one server per cache (h200_scaling.sh ab).
set -uo pipefail
source perf/device_call.sh r25c3
call_setup
call_gpu_tests kv_fp8 decode_attention step_qkv gpu_engine
step() {  # step LABEL FLAGS...
  local label=$1
  shift
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 90 python3 perf/bench_engine.py --batches 256 \
    --skip equivalence,offline,latency,probe,naive,prefix,fp32,split,profile "$@" \
    --out "$R/engine_$label" > "$R/engine_$label.log" 2>&1
  echo "engine $label: $(grep -E "decode step|ERROR" "$R/engine_$label.log" | head -2 | cut -c1-160)"
  cp "$R/engine_$label/bench.json" "$OUT/engine_$label.json" 2>/dev/null
  call_mark "engine $label"
}
step auto_a
step fp8_a --kv-cache-dtype fp8_e4m3
step fp8_b --kv-cache-dtype fp8_e4m3
step auto_b
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 120 python3 perf/bench_kv_fidelity.py \
  --out "$OUT/kv_fidelity.json" > "$R/kv_fidelity.log" 2>&1
tail -2 "$R/kv_fidelity.log" | cut -c1-400
call_mark "fidelity"
if [ "$(call_left ${END:-590})" -ge 270 ]; then
  AB="auto:kv_cache_dtype=auto;fp8:kv_cache_dtype=fp8_e4m3" LEVELS=256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
    timeout "$(call_left ${END:-590})" bash perf/h200_scaling.sh ab > "$R/ab.log" 2>&1
  call_levels
  cp $W/results/bench_single_*.json "$OUT/" 2>/dev/null
fi
call_mark "done"
