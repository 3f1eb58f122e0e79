#!/usr/bin/env bash
# Round 11, call 1 (prepared in round 10, not yet run; carry [".device", ".whl"]): a FRESH machine's
# first server goes straight into the 330 s mixed soak, before anything else warms the machine's
# kernel cache. Round 10 saw every fresh machine's first soak stop for 20-30 s a few seconds in
# (93 failures on call 3); since ad9fc5e ref_encoder warms its encoder at load. A stop now leaves
# stall_soak.txt with py-spy dumps of every model's stub (the .whl carries py-spy). Round 11 added:
# the host probe (perf/host_probe.py) at setup, the CPU series (perf/cpu_sample.py) under the soak,
# and a 15 s py-spy GIL record of the moss_tts stub 150 s into the soak (who holds the GIL with the
# host turn on).
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)" | head -2
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
RECORD=150:15:gil RECORD_RATE=100 RESPONSE_TIMEOUT=30 timeout $((585 - SECONDS + T0)) bash perf/h200_scaling.sh soak 330 2>&1 | tail -8
echo "soak $((SECONDS-T0)) s"
grep "^soak client 0:" $W/results/soak.log | head -5
grep -h "ref_encoder" $W/results/server_soak.log | grep -i "warm\|loaded" | head -3
python3 -m perf.served_budget $W/results/metrics_series_soak_load.txt | tail -1
grep -h "^cpu (cores" $W/results/scaling.log | tail -1
ls -la $W/results/record_* 2>/dev/null | head
