#!/usr/bin/env bash
# Round 26, call 4 (carry .device; ~9 min; any H100/H200 for the A/B, an H200 for the targets): the
# codec's fp8 rings (MossAudioCodec.serving_form_ ring_dtype, codec.transformer.RING_DTYPES), built
# this round and never run on a GPU.
# 1. GPU tests: the ring kernels on fp8 rings at the real head size (split and fused), the codec's
#    own GPU tests, the window-attention kernels' (the exact ring unchanged);
# 2. the codec stage with exact and fp8 rings, alternating (auto, fp8, fp8, auto): 1 x 2 and 256 x 10
#    steps, packed rounds of 128 and 256 rows; the fp8 runs also stream 4 x 50 random codes with each
#    ring (--ring-fidelity: the rings' cost in SNR) and profile a 128-row round.
set -uo pipefail
source perf/device_call.sh r26c4
call_gpu_tests ring_fp8 window_attention codec kv_int8
codec() {  # codec LABEL RING END [FLAGS...]
  local label=$1 ring=$2 end=$3
  shift 3
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left "$end")" python3 perf/bench_vocoder.py \
    --shapes 1x2,256x10 --rounds 128,256 --iters 10 --skip offline,streaming,equivalence --ring-dtype "$ring" "$@" \
    --out "$OUT/stage_vocoder_$label.json" > "$R/stage_vocoder_$label.log" 2>&1
  echo "codec $label:"; grep -E "^ +[0-9]+ x|round of|ring fidelity|Error" "$R/stage_vocoder_$label.log" | cut -c1-200
  call_mark "codec $label"
}
codec auto_a auto 250
codec fp8_a fp8_e4m3 370 --ring-fidelity 4x50 --profile-round 128
codec fp8_b fp8_e4m3 470
codec auto_b auto 580
call_mark "done"
