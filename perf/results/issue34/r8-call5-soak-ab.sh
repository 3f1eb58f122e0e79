#!/usr/bin/env bash
# Round 8, call 5 (round8-prep against main c8d6d45's served code, one machine, after one setup):
# a 60 s mixed soak of each (the device seconds left allowed no longer); what to read is the
# vocoder's frames per round and µs per frame under the soak, not the short soak's throughput.
set -uo pipefail
W=/tmp/moss-scale; mkdir -p $W/results
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
T0=$SECONDS
bash perf/h200_scaling.sh setup > /dev/null 2>&1; echo "setup $((SECONDS-T0)) s"
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xJf .device/ab/main-c8d6d45.tar.xz -C /tmp/old && cp perf/h200_scaling.sh /tmp/old/perf/
TAG=new RESPONSE_TIMEOUT=30 timeout 175 bash perf/h200_scaling.sh soak 60 2>&1 | grep -E "ready|exit|shutdown|ok'"
echo "new $((SECONDS-T0)) s"
(cd /tmp/old && TAG=old RESPONSE_TIMEOUT=30 timeout 175 bash perf/h200_scaling.sh soak 60 2>&1 | grep -E "ready|exit|shutdown|ok'")
echo "old $((SECONDS-T0)) s"
for t in new old; do python3 -m perf.served_budget $W/results/metrics_series_soak_${t}_load.txt 2>&1 | tail -1; done
