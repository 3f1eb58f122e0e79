#!/usr/bin/env bash
# Round 25, call 4 (an H200 if one comes, the budget's last ~200 s; carry .device): the engine's graphed
# step at 256 slots with the exact cache and the fp8 one (FP8_CONFIG), the final code (the GPU's paths
# unchanged since call 3). Round 24's H200 step was 7.90 / 7.91 ms; the target is 7.5.
set -uo pipefail
source perf/device_call.sh r25c4
call_setup
call_engine_step heads auto 120 --kv-cache-dtype auto
call_engine_step heads fp8 190 --kv-cache-dtype fp8_e4m3
