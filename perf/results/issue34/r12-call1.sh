#!/usr/bin/env bash
# Round 12, call 1 (prepared in round 11, not yet run; one machine, carry .device): the vocoder's
# load hold (vocoder_load_hold_ms) off, then 30 ms, one server each, the same sequence on each:
# the stream levels 128 then 256, then a 90 s mixed soak, then SIGTERM. Round 10 measured the
# hold only on a machine whose soak was host-bound (27 ms a step), where the GPU was not the
# bound; round 11 found the steal-free soak GPU-bound (vocoder 119-frame rounds at 115 us a frame,
# busy 93%). Compare steal-free windows only: served_budget --cpu prints them per arm, and each
# level's JSON has host_steal_cores. Files tagged lh0 / lh30.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
for arm in lh0:0:2 lh30:30:1; do  # name:vocoder_load_hold_ms:share of the time left
  IFS=: read -r tag ms share <<< "$arm"
  TAG=$tag PARAMS=vocoder_load_hold_ms=$ms BENCH=1 LEVELS=128,256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
    timeout $(( (575 - SECONDS + T0) / share )) bash perf/h200_scaling.sh soak 90 2>&1 | tail -6
  echo "$tag $((SECONDS-T0)) s"
done
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for t in lh0 lh30; do
  python3 -m perf.served_budget $W/results/metrics_series_soak_$t.txt | tail -1
  python3 -m perf.served_budget $W/results/metrics_series_soak_${t}_load.txt --cpu $W/results/cpu_series_soak_$t.txt | tail -8
  python3 -c "import json; [print('$t', l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms']['p95'], l['rtf']['p95'], l['streams_with_underruns'], l['host_steal_cores']) for l in json.load(open('$W/results/bench_soak_${t}_1.json'))]"
done
