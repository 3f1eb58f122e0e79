#!/usr/bin/env bash
# Round 24, call 1 (an H200, needs_h200; carry .device; ~9.5 min). Which measurement the host allows:
# the served levels vary with the lent machine's host (round 17's 31 ms Python probe served
# 1,040-1,047 audio-s/s at 256 streams, round 23's machine at 60 ms 771-850, the same code), so the
# host is probed first, after setup:
# - fast (probe <= FAST_MS, 45): the served levels at once, before the host can drift (stream 1,
#   128, 256 and offline 256, twice; round 23's machine read 32 ms at the soak, 60 eight minutes on);
# - slow: this tree against e913228 on the same machine (h200_scaling.sh trees: the machine or the
#   code?), since a slow host's levels count for no target.
# Then, either way, the GPU-only figures no host moves: the engine's graphed decode step at 256 (the
# heads-first grid was never timed on an H200; round 7: 7.90 ms, target 7.5), twice. (The GEMM sweep
# this call first carried ran on an H100 as r24-call2-gemm.sh: fused_linear lost at every shape.)
set -uo pipefail
source perf/device_call.sh r24c1
call_host_probe
if [ "$PROBE_MS" -le "${FAST_MS:-45}" ]; then
  echo "fast host: the served levels"
  REPEAT=2 LEVELS=1,128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
    timeout $(call_left 400) bash perf/h200_scaling.sh layout single 2>&1 | tail -4
  call_mark "levels done"
else
  echo "slow host: this tree against e913228"
  rm -rf /tmp/old && mkdir -p /tmp/old && tar -xJf .device/ab/main-e913228.tar.xz -C /tmp/old
  ROUNDS=1 REPEAT=1 LEVELS=128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
    timeout $(call_left 430) bash perf/h200_scaling.sh trees /tmp/old > $R/trees.log 2>&1
  call_mark "trees done"
fi
grep -h "host probe" $W/results/scaling.log
call_levels
cp $W/results/bench_single_*.json $OUT/ 2>/dev/null
call_engine_step heads a 520
if [ "$(call_left 590)" -gt 60 ]; then call_engine_step heads b 590; fi
call_mark "done"
