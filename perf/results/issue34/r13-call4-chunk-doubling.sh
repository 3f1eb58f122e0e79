#!/usr/bin/env bash
# Prepared in round 13, not yet run (one machine, carry .device; ~8 min): chunk_doubling's A/B.
# At 256 streams the second chunk (4 frames, due within the first chunk's 160 ms) was late in 255
# of 282 underruns, by 121 ms on average: the steps that admit a wave took 44 ms and more (round 13, call 1). Doubling makes
# it 2 frames (2, 2, 4, 8, 16, 25). One server per arm: chunk_doubling false then true, the stream
# levels 128 and 256 twice (underruns_by_chunk; first audio at 128, whose target is p95 <= 250 ms),
# then a 60 s soak. PK: prefill_kernel in both arms (set it to what r13-call2's A/B chose).
set -uo pipefail
T0=$SECONDS  # before the pack's unpacking: every second of the call counts against its 600
W=/tmp/moss-scale; R=$W/results/c4; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
AB="cd0:chunk_doubling=false,prefill_kernel=${PK:-false};cd1:chunk_doubling=true,prefill_kernel=${PK:-false}" \
  AB_UNTIL=$(( $(date +%s) + 545 - SECONDS + T0 )) BENCH=1 LEVELS=128,256 MODE=stream REPEAT=2 RESPONSE_TIMEOUT=30 \
  bash perf/h200_scaling.sh ab_soak 60
grep -h '"python_ms"' $W/results/scaling.log | tail -1
