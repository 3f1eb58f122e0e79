#!/usr/bin/env bash
# Round 22, call 2 (prepared in round 21; ran in round 22 on an H100, 200 s: heads first faster, now
# served; perf/RESULTS.md; carry .device; ~4 min; an H200: the engine target is an H200's). Round
# 21's H100 profile of the engine's step at batch 256 (9.32 ms of kernels,
# r21-h100-engine-256-profile-graph-call4.txt): decode attention is the largest item, 3.03 ms (84 us
# a layer); round 8's H200 sweep left it at 60.7 us a layer, 3.74 TB/s of ~4.8.
# DecodeConfig.heads_first (round 21, served off) launches one slot's 8 KV-head programs together, so
# they read the same 2 KB cache rows instead of 256-byte pieces of 8 slots' rows. Here:
# 1. its GPU tests (bit for bit the slot-major grid's output);
# 2. bench_decode_attention at 256 and 128 slots, both orders, the default tile and its neighbours;
# 3. the engine step at 256 (bench_engine) in each order, alternating (--decode-order, one process
#    each), for the figure beside round 7's 7.90 ms.
set -uo pipefail
source perf/device_call.sh r22c2
PYTHONPATH=python_backends:tests:. timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_decode_attention.py > $R/gpu_tests_decode_attention.txt 2>&1
echo "gpu tests decode attention: $(tail -1 $R/gpu_tests_decode_attention.txt)"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 200 python3 perf/bench_decode_attention.py --batches 256,128 \
  --blocks 32,64 --warps 4,8 --stages 2,3 --splits 0 --orders slots,heads --out $R/decode_attention.json \
  > $R/decode_attention.log 2>&1
grep -E "^best|default|Error" $R/decode_attention.log | head -12
call_engine_step slots a 585; call_engine_step heads a 585
if [ "$(call_left 585)" -gt 130 ]; then call_engine_step slots b 585; fi
if [ "$(call_left 585)" -gt 100 ]; then call_engine_step heads b 585; fi
cp $R/decode_attention.json $OUT/ 2>/dev/null
call_mark "done"
