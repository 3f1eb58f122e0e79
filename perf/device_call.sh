#!/usr/bin/env bash
# The common start of a device call script (a call = one `run` on a lent GPU machine, carry .device):
#   source perf/device_call.sh NAME
# sets T0 (the call's start: every second of it counts against its 600), W=/tmp/moss-scale and
# R=$W/results/NAME, traps the call's exit to tar $W/results into $OUT/results.tgz, unpacks the
# device pack (.device/triton-pack.tar.xz: tritonserver 2.51 and the stub) and sources its env.sh,
# and names the GPU. Then:
#   call_setup        perf/h200_scaling.sh setup (the real-size random checkpoint, ~31 s) into
#                     $R/setup.log; prints its last line and the call's seconds so far
#   call_until S      epoch seconds at S seconds into the call (AB_UNTIL, timeouts)
#   call_left S       seconds left until S seconds into the call
#   call_mark WHAT    "WHAT at N s"
#   call_gpu_tests T...  tests/test_T.py -m gpu, each file in a process of its own and all at once
#                     (a device-side assert poisons every later test of its process: round 14), into
#                     $R/gpu_tests_T.txt; waits for them and prints each file's last line
#   call_levels       a line per level of each bench_single_*.json (file, mode, concurrency, audio-s/s,
#                     first audio p50 / p95, RTF p95, streams with an underrun, failures)
T0=$SECONDS
W=/tmp/moss-scale
R=$W/results/${1:?source perf/device_call.sh NAME}
mkdir -p "$R"
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader

call_mark() { echo "$1 at $((SECONDS - T0)) s"; }
call_left() { echo $(( $1 - SECONDS + T0 )); }
call_until() { echo $(( $(date +%s) + $1 - SECONDS + T0 )); }
call_setup() {
  bash perf/h200_scaling.sh setup > "$R/setup.log" 2>&1
  tail -1 "$R/setup.log"
  call_mark "setup done"
}
call_gpu_tests() {
  local t pids=()
  for t in "$@"; do
    PYTHONPATH=python_backends:tests:. timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
      "tests/test_$t.py" > "$R/gpu_tests_$t.txt" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  for t in "$@"; do echo "gpu tests $t: $(tail -1 "$R/gpu_tests_$t.txt")"; done
}
call_levels() {
  local f
  for f in $W/results/bench_single_*.json; do python3 -c "import json,sys; [print(sys.argv[1].split('/')[-1], l['mode'], \
l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p50'), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), \
l['streams_with_underruns'], l['failures']) for l in json.load(open(sys.argv[1]))]" $f; done
}
