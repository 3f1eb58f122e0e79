#!/usr/bin/env bash
# Round 17, call 4 (carry .device; ~3 min after the start). After kernels/graph_capture.py (every CUDA
# graph captured with Python's cyclic collector held off: call 2's GPU run (r15-call3.sh) failed
# test_a_step_makes_few_torch_calls when an earlier test's engine, a dead reference cycle, was
# collected mid-capture and its graphs reset): the GPU tests, test_gpu_engine three times at once
# (each in a process of its own), beside the setup; then the served config's levels on this code
# (stream 1, 128, 256 and offline 1, 128, 256, twice; 20 c=1 requests in a row).
set -uo pipefail
source perf/device_call.sh r17c4
call_setup &
SETUP=$!
for k in 2 3; do
  PYTHONPATH=python_backends:tests:. timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_engine.py \
    > "$R/gpu_tests_gpu_engine_$k.txt" 2>&1 &
done
call_gpu_tests gpu_engine vocoder_worker prefill_attention step_qkv
wait
for k in 2 3; do echo "gpu tests gpu_engine ($k): $(tail -1 "$R/gpu_tests_gpu_engine_$k.txt")"; done
grep -h "function reset\|StreamCaptureInvalidated" $R/gpu_tests_*.txt | sort | uniq -c | head -3
C1_REQUESTS=20 REPEAT=2 LEVELS=1,128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
  timeout $(call_left 320) bash perf/h200_scaling.sh layout single 2>&1 | tail -4
call_mark "levels done"
call_levels
