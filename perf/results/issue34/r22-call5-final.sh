#!/usr/bin/env bash
# Round 22, call 5 (carry .device; <= 290 s: the budget's last minutes): the final code (heads-first
# decode grid served, the L2 prefetch removed) on a fresh call. The GPU tests of the decode
# attention (the served grid == the slot-major grid bit for bit), the engine (graphed == eager) and
# the codec's serving form; then the engine step at 256 in the served order and the old one,
# alternating while time is left.
set -uo pipefail
source perf/device_call.sh r22c5
call_gpu_tests decode_attention gpu_engine
call_engine_step heads a 290
if [ "$(call_left 290)" -gt 40 ]; then call_served_codec_gpu_tests; fi
if [ "$(call_left 290)" -gt 60 ]; then call_engine_step slots a 290; fi
call_mark "done"
