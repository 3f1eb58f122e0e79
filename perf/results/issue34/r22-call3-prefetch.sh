#!/usr/bin/env bash
# Round 22, call 3 (prepared in round 21; RAN in round 22 on an H100, 277 s: the prefetch measured no
# faster at 1 x 2 and its capture test failed, so its code was REMOVED in 7a86e20 and this script no
# longer runs on main: perf/RESULTS.md, round 22). Carry .device; ~6 min; any host, an H200 for
# figures against the 1 x 2 target). The codec's weights pulled into L2 one GEMM ahead at few-token
# steps (codec/weight_prefetch.py, kernels/l2_prefetch.py; bench-only, no served parameter yet).
# Round 21 measured the 1 x 2 step's GEMMs reading their weights at ~0.5-1.2 TB/s (cuBLAS, 3-13 MB
# each, ~5-11 us) and the small-GEMM path no faster. Here a side stream's bulk prefetches should
# turn those reads into L2 hits.
# 1. GPU tests (the audio bit for bit the same, eager and graphed; the plan on a real weight);
# 2. bench_l2_prefetch: does a prefetched weight make its GEMM an L2 hit (cold / prefetched / warm)?
# 3. bench_vocoder at l2_prefetch_rows 0 / 64 (every stage of a 1 x 2 step; with the profile of one
#    eager 1 x 2 step) / 256 (4 x 2 and the first stages of 16 x 10 too), alternating, then 0 / 64
#    again while time is left.
set -uo pipefail
source perf/device_call.sh r22c3
PYTHONPATH=python_backends:tests:. timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_l2_prefetch.py > $R/gpu_tests_l2_prefetch.txt 2>&1
echo "gpu tests l2 prefetch: $(tail -1 $R/gpu_tests_l2_prefetch.txt)"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 90 python3 perf/bench_l2_prefetch.py \
  --out $R/l2_prefetch.json > $R/l2_prefetch.log 2>&1
grep -E "M 2 |M 64 |Error|error" $R/l2_prefetch.log | head -18 | cut -c1-160
cp $R/l2_prefetch.json $OUT/ 2>/dev/null
prefetch() { call_small_gemm_vocoder 0 "pf$1_$2" --l2-prefetch-rows "$1" "${@:3}"; }
prefetch 0 a; prefetch 64 a --profile 1x2; prefetch 256 a
if [ "$(call_left 585)" -gt 100 ]; then prefetch 0 b; fi
if [ "$(call_left 585)" -gt 60 ]; then prefetch 64 b; fi
cp $R/vocoder_sg*.json $OUT/ 2>/dev/null
call_mark "done"
