#!/usr/bin/env bash
# Round 12, call 3 (a fresh machine, carry .device; the served defaults, vocoder_load_hold_ms 0):
# the stream level 256 once, then a 100 s mixed soak with two GPU traces of the moss_tts stub
# (GPU_TRACE: 1.5 s at 35 s and at 70 s into the soak; serving/gpu_trace.py), each cut into the
# GPU budget (perf/gpu_trace_budget.py): is the soak's GPU busy all the time, and with what?
# Call 2 found the soak's engine step at ~22 ms of wall against ~8.7 alone, with the vocoder's
# rounds at twice their time alone.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
GPU_TRACE=35:1.5,70:1.5 BENCH=1 LEVELS=256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
  timeout $((430 - SECONDS + T0)) bash perf/h200_scaling.sh soak 100 2>&1 | tail -4
echo "soak done $((SECONDS-T0)) s"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for f in $W/results/gpu_budget_*.txt; do echo "== $f"; head -40 "$f"; done
python3 -m perf.served_budget $W/results/metrics_series_soak_load.txt --cpu $W/results/cpu_series_soak.txt | tail -6
python3 -c "import json; [print(l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l['host_steal_cores']) for l in json.load(open('$W/results/bench_soak_1.json'))]"
