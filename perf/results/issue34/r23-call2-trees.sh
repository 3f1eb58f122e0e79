#!/usr/bin/env bash
# Round 23, call 2 (an H200, needs_h200; carry .device; ~6 min). Call 1 (r22-call4-served.sh, a warm
# H200 right after the second 330 s soak) served 770-850 audio-s/s at 256 streams and 765-780 at 128,
# where round 17's machine served 1,040-1,047 and 873-878 with e913228's code (rounds 18-22 changed
# the served code since: the wedge watch, in-band STOPs, the quantizer table, the heads-first grid).
# The machine or the code? One machine, one setup, the single layout from this tree (new) and from
# e913228 (old: .device/ab/main-e913228.tar.xz, its own scripts and model repository), alternating
# twice: stream and offline at 128 and 256 streams.
set -uo pipefail
source perf/device_call.sh r23c2
call_host_probe
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xJf .device/ab/main-e913228.tar.xz -C /tmp/old
ROUNDS=2 REPEAT=1 LEVELS=128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
  timeout $(call_left 560) bash perf/h200_scaling.sh trees /tmp/old > $R/trees.log 2>&1
call_mark "trees done"
for f in $W/results/bench_single_*.json; do
  python3 -c "import json,sys; [print(sys.argv[1].split('/')[-1], l['mode'], l['concurrency'], round(l['audio_s_per_s'], 1), \
l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l['failures'], l['host_busy_cores'], \
l['host_steal_cores']) for l in json.load(open(sys.argv[1]))]" $f
  cp $f $OUT/
done
grep -h "^| /tmp" $W/results/scaling.log 2>/dev/null | head -8
