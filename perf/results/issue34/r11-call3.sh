#!/usr/bin/env bash
# Round 11, call 3 (the final code: blocking device waits, real-time priorities off): one server, the bench levels
# 1, 128, 256 streamed and offline once, then a 240 s mixed soak
# against the same server, then SIGTERM (files bench_soak_1.json, soak.json, metrics_series_soak*.txt).
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c3; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | head -4
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
BENCH=1 LEVELS=1,128,256 MODE=stream,offline REPEAT=1 RESPONSE_TIMEOUT=30 \
  timeout $((585 - SECONDS + T0)) bash perf/h200_scaling.sh soak 240 2>&1 | tail -8
echo "soak $((SECONDS-T0)) s"
for f in $W/results/metrics_series_soak.txt $W/results/metrics_series_soak_load.txt; do
  [ -f $f ] && python3 -m perf.served_budget $f | tail -1
done
grep -h '"python_ms"' $W/results/scaling.log | tail -1
grep -h "^cpu (cores" $W/results/scaling.log | tail -1
