#!/usr/bin/env bash
# Round 13, call 1 (prepared in round 12, not yet run; a fresh machine, carry .device; the served
# defaults): a 100 s mixed soak with two GPU traces of the moss_tts stub, 0.75 s each at 40 s and
# at 75 s (GPU_TRACE; round 12's 1.5 s traces stalled the stub ~10 s while written, and came back
# truncated: fixed in 3f48d54), each cut into the soak's GPU budget (perf/gpu_trace_budget.py):
# busy / idle / overlap per stream, the engine's steps and gaps, prefill's and the codec's kernels.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
GPU_TRACE=40:0.75,75:0.75 RESPONSE_TIMEOUT=30 timeout $((430 - SECONDS + T0)) bash perf/h200_scaling.sh soak 100 2>&1 | tail -4
echo "soak done $((SECONDS-T0)) s"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for f in $W/results/gpu_budget_*.txt; do echo "== $f"; head -45 "$f"; done
python3 -m perf.served_budget $W/results/metrics_series_soak_load.txt --cpu $W/results/cpu_series_soak.txt | tail -6
