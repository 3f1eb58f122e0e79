#!/usr/bin/env bash
# Round 15, call 3 (prepared: the final code's levels, a fresh machine; carry .device; ~9.5 min). After
# r15-call2.sh has decided chunk_deadline_ms (set it in config.pbtxt and regenerate the placement
# configs first, or pass PARAMS=chunk_deadline_ms=N here), the level targets, two runs each:
# the GPU tests of the engine and the vocoder (each file in a process of its own) beside the setup,
# then one server: stream 1, 128, 256 and offline 128, 256 twice, then one stream of 20 requests in a
# row (first audio at c=1). The 330 s soak is r15-call1.sh (warm after this one if the budget allows).
set -uo pipefail
source perf/device_call.sh r15c3
call_setup &
SETUP=$!
call_gpu_tests gpu_engine vocoder_worker prefill_attention step_qkv
wait $SETUP
C1_REQUESTS=20 REPEAT=2 LEVELS=1,128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
  timeout $(call_left 570) bash perf/h200_scaling.sh layout single 2>&1 | tail -4
call_mark "levels done"
call_levels
