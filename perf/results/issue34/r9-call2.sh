#!/usr/bin/env bash
# Round 9, call 2: where an admission burst's engine host time goes. One server (single layout):
# the levels 128 and 256 (streamed, offline) with the engine counters every 0.1 s (step_launch_ms
# and step_apply_ms are new), each bench run followed by one whose client processes start together
# (--start-together: the variant files bench_single_v_K.json), a py-spy GIL record at 200 Hz of the
# first 16 s of the levels.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c2; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
METRICS_INTERVAL=0.1 RECORD=0:16:gil RECORD_RATE=200 VARIANT_ARGS=--start-together REPEAT=1 LEVELS=128,256 \
  MODE=stream,offline RESPONSE_TIMEOUT=30 timeout 420 bash perf/h200_scaling.sh layout single
echo "levels $((SECONDS-T0)) s"
S=$W/results/metrics_series_single.txt
[ -s "$S" ] && python3 perf/served_budget.py --timeline "$S" > $R/timeline.txt 2>&1 && awk '$4>100 || $5>20' $R/timeline.txt | head -60
