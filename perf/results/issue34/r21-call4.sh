#!/usr/bin/env bash
# Round 21, call 4 (carry .device; ~3 min; the budget's last ~380 s). The engine's decode step at
# batch 256 (target <= 7.5 ms; round 7: 7.90, not re-measured since) with the kernel profile of one
# graphed step: round 5's profile is the newest, and the next CPU work on the engine starts from it.
set -uo pipefail
source perf/device_call.sh r21c4
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 220 python3 perf/bench_engine.py --batches 256 \
  --skip equivalence,offline,latency,probe,naive,prefix,fp32,split --out $R/engine > $R/engine.log 2>&1
grep -E "step|256|profile|ERROR" $R/engine.log | head -12 | cut -c1-400
cp $R/engine/bench.json $OUT/engine_bench.json 2>/dev/null
cp $R/engine/profile_graph.txt $R/engine/profile_eager.txt $OUT/ 2>/dev/null
call_mark "done"
