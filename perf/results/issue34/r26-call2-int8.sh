#!/usr/bin/env bash
# Round 26, call 2 (carry .device; ~9.5 min): the int8 KV cache with a scale per (token, KV head)
# (EngineConfig.kv_cache_dtype="int8", kernels/kv_format.py), built this round and never run on a GPU.
# 1. its GPU tests and the other cache kernels' (real sizes), the engine graphed == eager on it (auto and fp8:
#    round 25);
# 2. the decode attention alone at 256 slots: int8's tile choices beside fp8's and the exact cache's;
# 3. the engine's graphed decode step at batch 256: auto, int8, int8, auto;
# 4. perf/bench_kv_fidelity.py: bf16 with each cache against fp32 (hidden states, greedy codes).
set -uo pipefail
source perf/device_call.sh r26c2
call_setup
call_gpu_tests kv_int8 kv_fp8 decode_attention prefill_attention step_qkv
PYTHONPATH=python_backends:tests:. timeout "$(call_left 230)" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_gpu_engine.py -k "equals_eager and int8" > "$R/gpu_tests_gpu_engine.txt" 2>&1
echo "gpu tests gpu_engine: $(tail -1 "$R/gpu_tests_gpu_engine.txt")"
call_mark "tests"
attention() {  # attention LABEL KV [FLAGS...]
  local label=$1 kv=$2
  shift 2
  PYTHONPATH=python_backends:. timeout 60 python3 perf/bench_decode_attention.py --batches 256 --orders heads \
    --splits 0 --kv-cache-dtype "$kv" --out "$OUT/attention_$label.json" "$@" > "$R/attention_$label.log" 2>&1
  grep -E "^b256 +bench_engine" "$R/attention_$label.log" | cut -c1-150
}
attention auto auto --blocks 64 --warps 4 --stages 2
attention fp8 fp8_e4m3 --blocks 64 --warps 4 --stages 3 --fp16-dots 1
attention int8 int8 --blocks 64 --warps 4,8 --stages 2,3 --fp16-dots 0,1
call_mark "attention"
call_engine_step heads auto_a 330 --kv-cache-dtype auto
call_engine_step heads int8_a 400 --kv-cache-dtype int8
call_engine_step heads int8_b 470 --kv-cache-dtype int8
call_engine_step heads auto_b 540 --kv-cache-dtype auto
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left 595)" python3 perf/bench_kv_fidelity.py \
  --out "$OUT/kv_fidelity.json" > "$R/kv_fidelity.log" 2>&1
tail -4 "$R/kv_fidelity.log" | cut -c1-400
call_mark "done"
