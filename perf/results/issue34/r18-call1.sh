#!/usr/bin/env bash
# Round 18, call 1 (prepared in round 17; carry .device and .whl; ~7 min). What round 17 left
# unmeasured on the final code, and the host's part in the served rate (round 17's two machines:
# a 12% slower Python probe, twice the engine's host time a step, 5-15% less served):
# - beside the setup: the host probe (python_ms, GIL regain);
# - the codec stage (bench_vocoder: 1x2, 256x10, packed rounds of 128 and 256 rows) and the engine's
#   decode step at batch 256 (bench_engine step), each alone on the GPU (round 8's table is the last);
# - one server: the stream levels 256 and 128 twice, with a 4 s py-spy GIL record from the first
#   level's start (RECORD=0:4:gil): who holds the GIL while the engine's host time is long.
# Then r15-call1.sh (warm, or on a second machine to compare hosts): the second 330 s soak.
set -uo pipefail
source perf/device_call.sh r18c1
call_setup &
SETUP=$!
python3 perf/host_probe.py --out $R/host_probe.json | tee -a $R/host_bench.txt
wait $SETUP
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 100 python3 perf/bench_vocoder.py --shapes 1x2,256x10 --rounds 128,256 \
  --iters 10 --skip offline,streaming,equivalence --out $R/stage_vocoder.json > $R/stage_vocoder.log 2>&1
grep -E "^ +[0-9]+ x|round of" $R/stage_vocoder.log | cut -c1-200
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 100 python3 perf/bench_engine.py --batches 256 \
  --skip equivalence,offline,latency,probe,naive,prefix,fp32,profile,split --out $R/stage_engine > $R/stage_engine.log 2>&1
grep -E "step|256" $R/stage_engine.log | head -6 | cut -c1-180
call_mark "stages done"
LEVELS=256,128 MODE=stream REPEAT=2 RECORD=0:4:gil RESPONSE_TIMEOUT=30 timeout $(call_left 575) \
  bash perf/h200_scaling.sh layout single 2>&1 | tail -4
call_mark "levels done"
call_levels
