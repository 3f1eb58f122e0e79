#!/usr/bin/env bash
# Round 19, call 1 (prepared in round 18; a fresh machine, carry .device and .whl; ~9 min). Round
# 18's two machines had slow hosts (one core's Python probe 68-73 ms against ~30): there the soak
# is bound by the engine's host time (23 ms a step against 5 ms of device wait) and no throughput
# target can show. So the host probe decides first:
# - a fast host (probe <= 45 ms): the 330 s mixed soak alone (the second soak run), with
#   the stall watcher's snapshots (both frontends, TCP states, native py-spy, cuda-gdb) should the
#   2.51 gRPC stream-handler wedge come back;
# - a slow host: GPU-bound work instead, whose figures do not depend on the host: the codec stage
#   with the split and the fused ring kernels (same machine: round 18 had no split figure from
#   fused's machine) and the engine's decode step.
set -uo pipefail
source perf/device_call.sh r19c1
call_host_probe
if [ "$PROBE_MS" -le 45 ]; then
  echo "fast host ($PROBE_MS ms): the 330 s soak"
  RECORD=0:4:gil RESPONSE_TIMEOUT=30 timeout $(call_left 585) bash perf/h200_scaling.sh soak 330 2>&1 | tail -12
  cp $W/results/soak.json $OUT/ 2>/dev/null
else
  echo "slow host ($PROBE_MS ms): the stage benches"
  for k in split fused; do
    PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 150 python3 perf/bench_vocoder.py --shapes 1x2,256x10 \
      --rounds 128,256 --iters 10 --skip offline,streaming --ring-kernel $k --out $R/vocoder_$k.json > $R/vocoder_$k.log 2>&1
    grep -E "^ +[0-9]+ x|round of" $R/vocoder_$k.log | cut -c1-200
  done
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 150 python3 perf/bench_engine.py --batches 256 \
    --skip equivalence,offline,latency,probe,naive,prefix,fp32,profile,split --out $R/engine > $R/engine.log 2>&1
  grep -E "step|256" $R/engine.log | head -6 | cut -c1-180
  cp $R/vocoder_*.json $OUT/ 2>/dev/null
fi
call_mark "done"
grep -h "work stalled\|moves again" $W/server_soak.log $W/results/server_soak.log 2>/dev/null | head -5
