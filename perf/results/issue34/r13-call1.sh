#!/usr/bin/env bash
# Round 13, call 1 (a fresh machine, carry .device; the served defaults): the whole GPU budget of
# the served load, from traces of the moss_tts stub (serving/gpu_trace.py, perf/gpu_trace_budget.py).
# - the stream level 256 twice; 0.75 s traced from 1.0 s after run 1's first wave is admitted
#   (`lvl256`: writing the trace stalls the stub ~5 s, so run 1's figures are not the level's;
#   run 2 is untraced);
# - a 100 s mixed soak with 0.75 s traces at 40 s and 75 s.
# Served at 256 streams the two stages reach ~0.86 of their rates alone, against 1.06 in
# bench_overlap's two-stream runs (round 12): is the rest idle GPU (the host), or other work?
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
admitted() {
  python3 -c "import urllib.request,re; t=urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=2).read().decode(); \
m=re.search(r'stat=\"requests_admitted\"\} (\d+)', t); print(m.group(1) if m else 0)" 2>/dev/null || echo 0
}
( # the level's trace: once 200 requests are admitted (the first wave), 1.0 s on
  for _ in $(seq 3000); do [ "$(admitted)" -ge 200 ] && break; sleep 0.1; done
  sleep 1.0; d=$W/gputrace_soak; mkdir -p $d
  echo "0.75 lvl256" > $d/request.tmp && mv $d/request.tmp $d/request; echo "lvl256 trace asked $((SECONDS-T0)) s"
  for _ in $(seq 240); do [ -e $d/lvl256.json.gz ] || [ -e $d/lvl256.error ] && break; sleep 0.5; done
  python3 perf/gpu_trace_budget.py $d/lvl256.json.gz --out $R/gpu_budget_lvl256.json > $R/gpu_budget_lvl256.txt 2>&1
  cp $d/lvl256.json.gz $OUT/gputrace_lvl256.json.gz 2>/dev/null
) &
GPU_TRACE=40:0.75,75:0.75 BENCH=1 LEVELS=256 MODE=stream REPEAT=2 RESPONSE_TIMEOUT=30 \
  timeout $((470 - SECONDS + T0)) bash perf/h200_scaling.sh soak 100 2>&1 | tail -4
echo "soak done $((SECONDS-T0)) s"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for f in $R/gpu_budget_*.txt $W/results/gpu_budget_*.txt; do [ -e "$f" ] && { echo "== $f"; head -60 "$f"; }; done
python3 -m perf.served_budget $W/results/metrics_series_soak_load.txt --cpu $W/results/cpu_series_soak.txt | tail -6
for k in 1 2; do python3 -c "import json; [print($k, l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l.get('underruns_by_chunk'), l['host_steal_cores']) for l in json.load(open('$W/results/bench_soak_$k.json'))]"; done
