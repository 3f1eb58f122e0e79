#!/usr/bin/env bash
# Round 23, call 4 (prepared, not run: no H200 came; an H200, needs_h200; carry .device; ends by END
# (300) s of the call). Call 1b (r22-call4-served.sh, a warm H200 right after the second 330 s soak)
# served 770-850 audio-s/s at 256 streams and 765-780 at 128, where round 17's machine served
# 1,040-1,047 and 873-878 with e913228's code (rounds 18-22 changed the served code since: the wedge
# watch, in-band STOPs, the quantizer table, the heads-first grid). The machine or the code? One
# machine, one setup, then `h200_scaling.sh trees`: the single layout from this tree (newK) and from
# e913228 (oldK: .device/ab/main-e913228.tar.xz, its own scripts and model repository), alternating
# ROUNDS (1; 2 fits a whole call) times, stream and offline at 128 and 256 streams, a host probe before
# each server (call 1b's machine read 32 ms at the soak, 60 ms eight minutes later).
set -uo pipefail
source perf/device_call.sh r23c4
call_host_probe
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xJf .device/ab/main-e913228.tar.xz -C /tmp/old
ROUNDS=${ROUNDS:-1} REPEAT=1 LEVELS=128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
  timeout $(call_left ${END:-300}) bash perf/h200_scaling.sh trees /tmp/old > $R/trees.log 2>&1
call_mark "trees done"
grep -h "host probe" $W/results/scaling.log
call_levels
cp $W/results/bench_single_*.json $OUT/ 2>/dev/null
