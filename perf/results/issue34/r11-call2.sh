#!/usr/bin/env bash
# Round 11, call 2 (one machine): the engine's and the vocoder's threads under SCHED_FIFO
# (engine_rt_priority 2, vocoder_rt_priority 1: serving/thread_priority.py) on, then off, one
# server each, the same sequence on each: the stream levels 128 then 256 (once; 128 is the
# warm-up before 256), then a 90 s mixed soak against the same server, then SIGTERM. "on" goes
# first, on the machine's cold first server, so a gain it shows is not the warm cache's. Files
# tagged rt / rt0 (bench_soak_TAG_1.json, soak_TAG.json, metrics_series_soak_TAG*.txt, cpu_series).
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
echo "sched_rt_runtime_us $(cat /proc/sys/kernel/sched_rt_runtime_us)"
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
for arm in rt:2:1:2 rt0:0:0:1; do  # name:engine priority:vocoder priority:share of the time left
  IFS=: read -r tag ep vp share <<< "$arm"
  TAG=$tag PARAMS=engine_rt_priority=$ep,vocoder_rt_priority=$vp BENCH=1 LEVELS=128,256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
    timeout $(( (575 - SECONDS + T0) / share )) bash perf/h200_scaling.sh soak 90 2>&1 | tail -6
  echo "$tag $((SECONDS-T0)) s"
done
grep -h '"python_ms"' $W/results/scaling.log | tail -1
grep -h "thread keeps its normal priority" $W/results/server_soak_rt.log | head -2
for t in rt rt0; do
  for f in $W/results/metrics_series_soak_$t.txt $W/results/metrics_series_soak_${t}_load.txt; do
    [ -f $f ] && python3 -m perf.served_budget $f | tail -1
  done
  python3 perf/cpu_sample.py --summary $W/results/cpu_series_soak_$t.txt --skip 40
done
