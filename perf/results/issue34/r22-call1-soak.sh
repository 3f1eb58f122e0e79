#!/usr/bin/env bash
# Next round, call 1 (prepared in round 21, not run: a fresh H200: needs_h200, the soak
# does not fit 78 GiB; carry .device; ~9.5 min). The issue's second 330 s mixed soak at 256 streams
# (round 17's met the target once: 935.4 audio-s/s) on a fast host only (probe <= 45 ms); on a slow
# one it would show the host, not the code, so the call runs r22-call5-final.sh instead (GPU
# tests and the engine step at 256, <= 290 s: host-independent; r22-call2-attention.sh, its
# fallback until round 22, ran in round 22).
set -uo pipefail
source perf/device_call.sh r22c1
call_host_probe
if [ "$PROBE_MS" -gt 45 ]; then
  echo "slow host ($PROBE_MS ms): no soak; the final code's GPU tests and engine step instead"
  bash perf/results/issue34/r22-call5-final.sh
  exit 0
fi
RECORD=$(ls .whl/py_spy-*.whl >/dev/null 2>&1 && echo 0:4:gil) RESPONSE_TIMEOUT=30 \
  timeout $(call_left 585) bash perf/h200_scaling.sh soak 330 2>&1 | tail -12
cp $W/results/soak.json $OUT/ 2>/dev/null
grep -h "work stalled\|moves again" $W/server_soak.log $W/results/server_soak.log 2>/dev/null | head -5
call_mark "done"
