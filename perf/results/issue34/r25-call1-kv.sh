#!/usr/bin/env bash
# Round 25, call 1 (an H200, needs_h200; carry .device; ~8.5 min): the fp8 KV cache
# (EngineConfig.kv_cache_dtype, kernels/kv_format.py), built this round and never run on a GPU.
# 1. its GPU tests (kernels at real sizes; the engine graphed == eager on it, the prefix pool too);
# 2. the engine's graphed decode step at batch 256, the exact cache against fp8, alternating
#    (auto, fp8, fp8, auto), each with the profile of one eager step (decode attention's kernel time);
# 3. perf/bench_kv_fidelity.py: bf16 with each cache against fp32 (hidden states, greedy codes).
set -uo pipefail
source perf/device_call.sh r25c1
call_setup
call_gpu_tests kv_fp8 gpu_engine
step() {  # step LABEL KV END
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left "$3")" python3 perf/bench_engine.py --batches 256 \
    --skip equivalence,offline,latency,probe,naive,prefix,fp32,split --kv-cache-dtype "$2" \
    --out "$R/engine_$1" > "$R/engine_$1.log" 2>&1
  echo "engine $1: $(grep -E "decode step|ERROR" "$R/engine_$1.log" | head -2 | cut -c1-160)"
  cp "$R/engine_$1/bench.json" "$OUT/engine_$1.json" 2>/dev/null
  cp "$R/engine_$1/profile.txt" "$OUT/engine_$1_profile.txt" 2>/dev/null
  grep -E "_split_kernel|_combine_kernel|Self CUDA time total" "$R/engine_$1/profile.txt" 2>/dev/null | cut -c1-160
  call_mark "engine $1"
}
step auto_a auto 250
step fp8_a fp8_e4m3 310
step fp8_b fp8_e4m3 370
step auto_b auto 430
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left 590)" python3 perf/bench_kv_fidelity.py \
  --out "$OUT/kv_fidelity.json" > "$R/kv_fidelity.log" 2>&1
tail -4 "$R/kv_fidelity.log" | cut -c1-400
call_mark "done"
