#!/usr/bin/env bash
# Round 13, call 3 (prepared in round 12, not yet run; one machine, carry .device): the 256-stream
# underruns (target <= 1% of streams; round 12: 75-270 of 512, one ~28 ms gap each). Under the chunk
# rule a stream's 2nd-4th chunks need engine steps under 40 ms (RESULTS, round 12), and a wave of
# 256 admitted prompts makes longer ones. prefill_chunk_tokens (4096 served) caps a step's prefill:
# 4096 against 2048, one server each, the stream levels 128 and 256 twice, then a 60 s soak.
# bench_triton's underruns_by_chunk says which chunk ran dry in each arm; first audio at 128 is
# what the smaller cap may cost (target p95 <= 250 ms). Files tagged p4096 / p2048.
set -uo pipefail
T0=$SECONDS  # before the pack's unpacking: every second of the call counts against its 600
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
AB="p4096:prefill_chunk_tokens=4096;p2048:prefill_chunk_tokens=2048" AB_UNTIL=$(( $(date +%s) + 545 - SECONDS + T0 )) \
  BENCH=1 LEVELS=128,256 MODE=stream REPEAT=2 RESPONSE_TIMEOUT=30 bash perf/h200_scaling.sh ab_soak 60
