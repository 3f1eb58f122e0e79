#!/usr/bin/env bash
# Round 12, call 2 (prepared in round 11, not yet run; one machine, carry .device): the vocoder's
# rounds on their own CUDA stream (vocoder_stream "own", served) against the engine's stream
# ("engine": rounds between steps, serial), one server each, the same sequence on each: the
# stream levels 128 then 256, then a 90 s mixed soak, then SIGTERM. Why: in round 11's steal-free
# soak (call 2) the engine's step took 23.2 ms of GPU beside the vocoder's 119-frame rounds
# against ~8.5 alone, ~77 us of engine delay per decoded frame where a large round alone costs
# ~35 us a frame: small rounds' ~1,100 kernels may cost more interleaved than in turn. At the
# levels (rounds of 400-600 frames) concurrency may win. Compare steal-free windows only
# (served_budget --cpu; each level's host_steal_cores). Files tagged own / eng.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
for arm in own:own:2 eng:engine:1; do  # name:vocoder_stream:share of the time left
  IFS=: read -r tag vs share <<< "$arm"
  TAG=$tag PARAMS=vocoder_stream=$vs BENCH=1 LEVELS=128,256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
    timeout $(( (575 - SECONDS + T0) / share )) bash perf/h200_scaling.sh soak 90 2>&1 | tail -6
  echo "$tag $((SECONDS-T0)) s"
done
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for t in own eng; do
  python3 -m perf.served_budget $W/results/metrics_series_soak_$t.txt | tail -1
  python3 -m perf.served_budget $W/results/metrics_series_soak_${t}_load.txt --cpu $W/results/cpu_series_soak_$t.txt | tail -8
  python3 -c "import json; [print('$t', l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms']['p95'], l['rtf']['p95'], l['streams_with_underruns'], l['host_steal_cores']) for l in json.load(open('$W/results/bench_soak_${t}_1.json'))]"
done
