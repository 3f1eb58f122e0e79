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
ARMS="pk0:false pk1:true"
# The kernel arm is skipped only when a test of the new kernels (or of a prefill) failed.
if grep -qE "^(FAILED|ERROR).*(prefill|block_copy)" $R/gpu_tests.txt; then ARMS="pk0:false"; echo "a kernel test failed: the kernel arm is not run"; fi
left=$(wc -w <<< "$ARMS")
for arm in $ARMS; do
  IFS=: read -r tag value <<< "$arm"
  TAG=$tag PARAMS=prefill_kernel=$value BENCH=1 LEVELS=256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
    timeout $(( (500 - SECONDS + T0) / left )) bash perf/h200_scaling.sh soak 45 2>&1 | tail -2
  echo "$tag $((SECONDS-T0)) s"; left=$((left - 1))
done
[ $((560 - SECONDS + T0)) -gt 20 ] && PYTHONPATH=python_backends:. timeout $((560 - SECONDS + T0)) \
  python3 perf/bench_prefill_attention.py --out $OUT/r13-prefill-attention-call2.json 2>&1 | grep -E "torch|default"
echo "bench done $((SECONDS-T0)) s"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for t in pk0 pk1; do
  [ -e $W/results/bench_soak_${t}_1.json ] || continue
  python3 -c "import json; [print('$t', l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l.get('underruns_by_chunk'), l['host_steal_cores']) for l in json.load(open('$W/results/bench_soak_${t}_1.json'))]"
  python3 -c "import json; d=json.load(open('$W/results/soak_$t.json')); print('$t soak', d['requests'], d['num_failures'], round(d['audio_seconds']/d['wall_seconds'],1), d['first_audio_ms_p50'], d['first_audio_ms_p95'])" 2>/dev/null
  python3 -m perf.served_budget $W/results/metrics_series_soak_${t}_load.txt --cpu $W/results/cpu_series_soak_$t.txt 2>/dev/null | tail -2
done
grep -h "shutdown took\|stub crash" $W/results/scaling.log | tail -4
