#!/usr/bin/env bash
# Round 12, call 0 (prepared in round 11, not yet run; no carry: torch and this tree only, no
# tritonserver): perf/bench_overlap.py on the real-size random engine and codec, ~2-3 min. The
# engine's decode step at 256 rows alone, each vocoder round shape alone, then both together on
# two CUDA streams (served) and on one stream (vocoder_stream "engine"): whether the soak's small
# rounds cost more beside the steps than in turn, before spending a served A/B (r12-call2.sh) on it.
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 420 python3 perf/bench_overlap.py \
  --rounds 1x2,12x10,48x10,128x5 --seconds 4 --out "$OUT/r12-overlap.json" 2>&1 | grep -v "^\s*$" | tail -20
