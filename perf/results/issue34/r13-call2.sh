#!/usr/bin/env bash
# Round 13, call 2 (one machine, carry .device; ~9.5 min): prefill_kernel, the prefill in place
# (step_qkv.prefill_qkv, kernels/prefill_attention.py, kernels/block_copy.py). Call 1's served traces
# put ~42% of the engine stream's GPU time in prefill launches, half of it copies and a masked SDPA,
# with the soak's GPU busy 99%.
# - the kernels' GPU tests (and the engine's, whose prefills run them) beside the setup;
# - the served A/B, one server each: prefill_kernel false then true, the stream level 256 once,
#   then a 45 s mixed soak (the true arm unless a test of the new kernels or of a prefill failed);
# - perf/bench_prefill_attention.py with what is left (its JSON is written after each shape).
set -uo pipefail
T0=$SECONDS  # before the pack's unpacking: every second of the call counts against its 600
W=/tmp/moss-scale; R=$W/results/c2; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1 &
SETUP=$!
PYTHONPATH=python_backends:tests:. timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_prefill_attention.py tests/test_step_qkv.py tests/test_block_copy.py tests/test_gpu_engine.py > $R/gpu_tests.txt 2>&1
TESTS=$?
echo "gpu tests rc $TESTS at $((SECONDS-T0)) s: $(tail -1 $R/gpu_tests.txt)"
grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head -8
wait $SETUP; tail -1 $R/setup.log; echo "setup done $((SECONDS-T0)) s"
AB="pk0:prefill_kernel=false;pk1:prefill_kernel=true"
# The kernel arm is skipped only when a test of the new kernels (or of a prefill) failed.
if grep -qE "^(FAILED|ERROR).*(prefill|block_copy)" $R/gpu_tests.txt; then AB="pk0:prefill_kernel=false"; echo "a kernel test failed: the kernel arm is not run"; fi
AB=$AB AB_UNTIL=$(( $(date +%s) + 500 - SECONDS + T0 )) BENCH=1 LEVELS=256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
  bash perf/h200_scaling.sh ab_soak 45
echo "arms done $((SECONDS-T0)) s"
[ $((560 - SECONDS + T0)) -gt 20 ] && PYTHONPATH=python_backends:. timeout $((560 - SECONDS + T0)) \
  python3 perf/bench_prefill_attention.py --out $OUT/r13-prefill-attention-call2.json 2>&1 | grep -E "torch|default"
echo "bench done $((SECONDS-T0)) s"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
