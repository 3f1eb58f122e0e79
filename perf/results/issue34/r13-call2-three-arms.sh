#!/usr/bin/env bash
# Prepared in round 13, not yet run: r13-call2.sh and r13-call4-chunk-doubling.sh in one call (one
# machine, carry .device; ~9.5 min), for a session whose 30 device minutes must also hold a final
# fresh-machine measurement. The GPU tests of the prefill kernels beside the setup, then three
# servers, each the stream levels 128 and 256 once and a 30 s soak:
#   base   prefill_kernel false, chunk_doubling false (the served defaults of round 13)
#   pk     prefill_kernel true                        (the prefill in place: A/B against base)
#   pkcd   prefill_kernel true, chunk_doubling true   (the second chunk after 2 steps: against pk)
# If the GPU tests fail, only base runs.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c2; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1 &
SETUP=$!
PYTHONPATH=python_backends:tests:. timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_prefill_attention.py tests/test_step_qkv.py tests/test_block_copy.py tests/test_gpu_engine.py > $R/gpu_tests.txt 2>&1
TESTS=$?
echo "gpu tests rc $TESTS at $((SECONDS-T0)) s: $(tail -1 $R/gpu_tests.txt)"
grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head -8
wait $SETUP; tail -1 $R/setup.log; echo "setup done $((SECONDS-T0)) s"
ARMS="base:false:false pk:true:false pkcd:true:true"
[ "$TESTS" = 0 ] || ARMS="base:false:false"
left=$(wc -w <<< "$ARMS")
for arm in $ARMS; do  # name:prefill_kernel:chunk_doubling
  IFS=: read -r tag pk cd <<< "$arm"
  TAG=$tag PARAMS=prefill_kernel=$pk,chunk_doubling=$cd BENCH=1 LEVELS=128,256 MODE=stream REPEAT=1 \
    RESPONSE_TIMEOUT=30 timeout $(( (585 - SECONDS + T0) / left )) bash perf/h200_scaling.sh soak 30 2>&1 | tail -2
  echo "$tag $((SECONDS-T0)) s"; left=$((left - 1))
done
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for t in base pk pkcd; do
  [ -e $W/results/bench_soak_${t}_1.json ] || continue
  python3 -c "import json; [print('$t', l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l.get('underruns_by_chunk'), l['host_steal_cores']) for l in json.load(open('$W/results/bench_soak_${t}_1.json'))]"
  python3 -c "import json; d=json.load(open('$W/results/soak_$t.json')); print('$t soak', d['requests'], d['num_failures'], round(d['audio_seconds']/d['wall_seconds'],1), d['first_audio_ms_p50'], d['first_audio_ms_p95'])" 2>/dev/null
  python3 -m perf.served_budget $W/results/metrics_series_soak_${t}_load.txt --cpu $W/results/cpu_series_soak_$t.txt 2>/dev/null | tail -2
done
grep -h "shutdown took\|stub crash" $W/results/scaling.log | tail -6
