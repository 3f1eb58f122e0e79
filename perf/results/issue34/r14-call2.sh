#!/usr/bin/env bash
# Round 14, call 2 (one machine, carry .device; ~4.5 min, the session's last device seconds): the
# served config (prefill_kernel on, as call 1's pk1 arm) at stream levels 1 and 128, plus one stream
# of 20 requests for first audio at c=1 (LV, MD, C1: other levels, modes, c=1 requests; C1=0: none).
set -uo pipefail
T0=$SECONDS
W=/tmp/moss-scale; R=$W/results; mkdir -p $R
trap 'cp $R/bench_*.json $OUT/ 2>/dev/null; tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup done $((SECONDS-T0)) s"
LEVELS=${LV:-1,128} MODE=${MD:-stream} REPEAT=1 C1_REQUESTS=${C1:-20} RESPONSE_TIMEOUT=30 timeout $((255 - SECONDS + T0)) \
  bash perf/h200_scaling.sh layout single 2>&1 | tail -4
echo "levels done $((SECONDS-T0)) s"
for f in $R/bench_single_*.json; do python3 -c "import json,sys; [print(sys.argv[1].split('/')[-1], l['concurrency'], \
round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p50'), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns']) \
for l in json.load(open(sys.argv[1]))]" $f; done
