#!/usr/bin/env bash
# Round 12, call 2 (one machine, carry .device): the vocoder's load hold (vocoder_load_hold_ms)
# off, then 30 ms, after its fix (the hold now counts from each piece's launch, not from the
# job's submit: r12-call1 found it held nothing, rounds 101 -> 118 frames, because 16- and
# 25-frame chunks and offline jobs go out in pieces of 10 frames and stay queued over several
# rounds). The same sequence per server: the stream levels 128 then 256, then a 90 s mixed soak,
# then SIGTERM; the second arm also runs stream level 1 and the offline levels. Compare
# steal-free windows only (served_budget --cpu; each level's
# host_steal_cores). Files tagged h0 / h30. (The vocoder_stream A/B planned here in round 11 is
# dropped: r12-call0's overlap bench found two streams ahead of one at every round shape.)
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
for arm in h0:0:2:128,256:stream h30:30:1:1,128,256:stream,offline; do  # name:hold ms:share of the time left:levels:modes
  IFS=: read -r tag ms share levels modes <<< "$arm"
  TAG=$tag PARAMS=vocoder_load_hold_ms=$ms BENCH=1 LEVELS=$levels MODE=$modes REPEAT=1 RESPONSE_TIMEOUT=30 \
    timeout $(( (575 - SECONDS + T0) / share )) bash perf/h200_scaling.sh soak 90 2>&1 | tail -6
  echo "$tag $((SECONDS-T0)) s"
done
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for t in h0 h30; do
  python3 -m perf.served_budget $W/results/metrics_series_soak_$t.txt | tail -1
  python3 -m perf.served_budget $W/results/metrics_series_soak_${t}_load.txt --cpu $W/results/cpu_series_soak_$t.txt | tail -8
  python3 -c "import json; [print('$t', l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p50'), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l['host_steal_cores'], l.get('mode')) for l in json.load(open('$W/results/bench_soak_${t}_1.json'))]"
done
