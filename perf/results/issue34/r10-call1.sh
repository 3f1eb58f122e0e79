#!/usr/bin/env bash
# Round 10, call 1 (one machine): the engine's host turn (EngineConfig.host_turn_ms) off and on,
# one server each, one after the other, the same sequence on each: the stream levels 128 then 256
# (once; 128 is the warm-up before 256), then a 90 s mixed soak against the same server, then
# SIGTERM. Files tagged off / on (bench_soak_TAG_1.json, soak_TAG.json, metrics_series_soak_TAG*.txt).
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
for arm in off:0:2 on:4:1; do  # name:host_turn_ms:share of the time left (half, then all)
  IFS=: read -r tag ms share <<< "$arm"
  TAG=$tag PARAMS=host_turn_ms=$ms BENCH=1 LEVELS=128,256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
    timeout $(( (575 - SECONDS + T0) / share )) bash perf/h200_scaling.sh soak 90 2>&1 | tail -6
  echo "$tag $((SECONDS-T0)) s"
done
for t in off on; do
  for f in $W/results/metrics_series_soak_$t.txt $W/results/metrics_series_soak_${t}_load.txt; do
    [ -f $f ] && python3 -m perf.served_budget $f | tail -2
  done
done
