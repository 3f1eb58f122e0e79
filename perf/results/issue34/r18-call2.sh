#!/usr/bin/env bash
# Round 18, call 2 (a fresh machine, carry .device and .whl; ~9 min). Call 1's soak wedged on a
# slow-host machine (Python probe 68 ms): 20 s in, no new stream reached moss_tts again, one
# stream's send never returned, the heartbeat stopped and no TCP connection to :8001 stayed open,
# for the soak's last 5 minutes. This call: the 330 s mixed soak alone (no levels first, so a
# slow machine's 111 s start still leaves it room), with the stall watcher's new snapshots (both
# frontends' health, every TCP state, moss_tts's native py-spy dump, tritonserver's cuda-gdb
# backtraces) should it wedge again, and the host probe beside the setup. It is also the issue's
# second 330 s soak run when it does not wedge.
set -uo pipefail
T0=$SECONDS  # before the pack's unpacking: every second of the call counts against its 600
W=/tmp/moss-scale; mkdir -p $W/results
trap 'cp $W/results/soak.json $OUT/ 2>/dev/null; tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
bash perf/h200_scaling.sh setup > $W/results/setup.log 2>&1; tail -1 $W/results/setup.log; echo "setup done $((SECONDS-T0)) s"
python3 perf/host_probe.py --out $W/results/host_probe.json 2>&1 | tail -1
RECORD=0:4:gil RESPONSE_TIMEOUT=30 timeout $((585 - SECONDS + T0)) \
  bash perf/h200_scaling.sh soak 330 2>&1 | tail -12
echo "done $((SECONDS-T0)) s"
grep -h "work stalled\|moves again" $W/server_soak.log $W/results/server_soak.log 2>/dev/null | head -5
