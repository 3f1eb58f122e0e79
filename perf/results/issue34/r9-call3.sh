#!/usr/bin/env bash
# Round 9, call 3 (a fresh machine): the first-audio hold A/B on one machine and the final code's
# levels. Two servers, one after the other: TAG off (first_audio_hold_rows=0, as before this
# round: the levels 1 and 256 streamed once) and TAG on (the served default, 4: the levels 1, 128,
# 256 streamed and offline twice); each then one stream 20 requests in a row
# (bench_single_TAG_c1.json). Call 4 (the soak) may follow warm.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c3; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
TAG=off PARAMS=first_audio_hold_rows=0 C1_REQUESTS=20 REPEAT=1 LEVELS=1,256 MODE=stream RESPONSE_TIMEOUT=30 \
  timeout 200 bash perf/h200_scaling.sh layout single
echo "off $((SECONDS-T0)) s"
TAG=on C1_REQUESTS=20 REPEAT=2 LEVELS=1,128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
  timeout $((560 - SECONDS + T0)) bash perf/h200_scaling.sh layout single
echo "on $((SECONDS-T0)) s"
grep -h "first_audio_hold\|first_audio_holds" $W/results/metrics_single_*.txt 2>/dev/null | head -6
