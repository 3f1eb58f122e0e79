#!/usr/bin/env bash
# Round 25, call 2 (an H200, needs_h200; carry .device; ~8 min). Call 1 ran the fp8 KV cache on an
# H100 (step 9.49/9.52 -> 8.87/8.85 ms at 256; its decode attention 81.5 -> 64.6 µs a call, not half).
# 1. test_kv_fp8's GPU tests (the bf16 key tolerance fixed after call 1);
# 2. the decode attention on fp8 caches swept (keys per tile, warps, stages, fp16 dots; heads first), and
#    the bf16 cache's default beside it;
# 3. the engine's graphed step at 256 on an H200: auto, fp8 (FP8_CONFIG), fp8 with the sweep's best
#    tile for the bench_engine mix (--decode-config), auto;
# (As run, the sweep's line lacked `env`: timeout could not start it, and the sweep ran on the warm
# machine right after, inline, as did the engine step with its best tile: RESULTS, round 25.)
# 4. the codec stage figures on the final code and the profile of a packed 128-row round
#    (r24-call6-codec.sh's bench, never run: no H200 came in round 24).
set -uo pipefail
source perf/device_call.sh r25c2
call_setup
call_gpu_tests kv_fp8
ATT="env PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 python3 perf/bench_decode_attention.py --batches 256 --orders heads --splits 0"
eval "$ATT --kv-cache-dtype auto --blocks 64 --warps 4 --stages 2 --out $OUT/attention_auto.json" > $R/attention_auto.log 2>&1
eval "timeout $(call_left 200) $ATT --kv-cache-dtype fp8_e4m3 --blocks 64,128 --warps 4,8 --stages 2,3 --fp16-dots 0,1 --out $OUT/attention_fp8.json" \
  > $R/attention_fp8.log 2>&1
grep -h "^best\|default" $R/attention_auto.log $R/attention_fp8.log | cut -c1-160
BEST=$(python3 -c "import json; r=[x for x in json.load(open('$OUT/attention_fp8.json'))['runs'] if x['mix']=='bench_engine']; \
b=min(r, key=lambda x: x['us_per_call']); print(f\"{b['block_n']},{b['num_warps']},{b['num_stages']},{int(b['fp16_dots'])}\")" 2>/dev/null || echo "64,4,2,0")
echo "fp8 best tile (bench_engine mix): $BEST"
call_mark "attention sweep"
step() {  # step LABEL END FLAGS...
  local label=$1 end=$2
  shift 2
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left "$end")" python3 perf/bench_engine.py --batches 256 \
    --skip equivalence,offline,latency,probe,naive,prefix,fp32,split,profile "$@" \
    --out "$R/engine_$label" > "$R/engine_$label.log" 2>&1
  echo "engine $label: $(grep -E "decode step|ERROR" "$R/engine_$label.log" | head -2 | cut -c1-160)"
  cp "$R/engine_$label/bench.json" "$OUT/engine_$label.json" 2>/dev/null
  call_mark "engine $label"
}
step auto_a 265
step fp8_a 310 --kv-cache-dtype fp8_e4m3
step fp8best_a 355 --kv-cache-dtype fp8_e4m3 --decode-config "$BEST"
step auto_b 400
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout $(call_left 585) python3 perf/bench_vocoder.py \
  --shapes 1x2,256x10 --rounds 128,256 --profile-round 128 --iters 10 --skip offline,streaming,equivalence \
  --out $OUT/stage_vocoder.json > $R/stage_vocoder.log 2>&1
grep -E "^ +[0-9]+ x|round of|Error" $R/stage_vocoder.log | cut -c1-200
cp $R/stage_vocoder.log $OUT/
call_mark "done"
