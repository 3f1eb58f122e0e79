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
