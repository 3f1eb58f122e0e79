#!/usr/bin/env bash
# Round 23, call 4 (an H200, needs_h200; carry .device; END (300) s of the call). A shorter form of
# r23-call2-trees.sh for the budget's last minutes: one setup, then the single layout from this tree
# (new1), from e913228 (old1: round 17-18's served code, .device/ab/main-e913228.tar.xz) and from this
# tree again (new2), stream and offline at 128 and 256 streams once each, a host probe before each
# server (round 23's call 1b found one machine's probe at 32 ms, then 60 ms eight minutes later).
set -uo pipefail
source perf/device_call.sh r23c4
call_host_probe
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xJf .device/ab/main-e913228.tar.xz -C /tmp/old
serve() {  # TAG DIR
  python3 perf/host_probe.py --out "$R/host_probe_$1.json" | python3 -c "import json,sys; print('$1 probe', json.load(sys.stdin)['python_ms'], 'ms')"
  (cd "$2" && TAG=$1 REPEAT=1 LEVELS=128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
    timeout $(call_left ${END:-300}) bash perf/h200_scaling.sh layout single > "$R/layout_$1.log" 2>&1)
  call_mark "$1 done"
}
serve new1 .; serve old1 /tmp/old; serve new2 .
for f in $W/results/bench_single_*.json; do
  python3 -c "import json,sys; [print(sys.argv[1].split('/')[-1], l['mode'], l['concurrency'], round(l['audio_s_per_s'], 1), \
l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l['failures'], l['host_busy_cores'], \
l['host_steal_cores']) for l in json.load(open(sys.argv[1]))]" $f
  cp $f $OUT/
done
