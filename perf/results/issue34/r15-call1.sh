#!/usr/bin/env bash
# Round 15, call 1 (one machine, carry .device and .whl; ~9 min). Round 14 served prefill_kernel (the
# soak +15%); the 256-stream wave's start is still host-bound (round 13's trace: GPU 62% busy, 44 ms
# steps of 18 ms GPU work) and its second chunks underrun. Here, on the served config:
# - the stream levels 256 then 128, then the 330 s mixed soak (the soak target) on one server;
# - py-spy (GIL holder only, non-blocking) of the moss_tts stub over the soak's first 4 s (RECORD
#   counts from the soak's start when BENCH=1 runs the levels first: 256 mixed streams starting
#   at once, a wave): which thread and which Python the slow launch phases of an admitted wave
#   spend. For the 256-level's own wave instead: RECORD with `layout single` (h200_scaling.sh).
set -uo pipefail
T0=$SECONDS  # before the pack's unpacking: every second of the call counts against its 600
W=/tmp/moss-scale; mkdir -p $W/results
trap 'cp $W/results/bench_soak_1.json $W/results/soak.json $OUT/ 2>/dev/null; tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
bash perf/h200_scaling.sh setup > $W/results/setup.log 2>&1; tail -1 $W/results/setup.log; echo "setup done $((SECONDS-T0)) s"
BENCH=1 LEVELS=256,128 MODE=stream REPEAT=1 RECORD=0:4:gil RESPONSE_TIMEOUT=30 timeout $((575 - SECONDS + T0)) \
  bash perf/h200_scaling.sh soak 330 2>&1 | tail -12
echo "done $((SECONDS-T0)) s"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
