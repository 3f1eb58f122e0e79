#!/usr/bin/env bash
# Round 13, call 2 (one machine, carry .device): the prefill kernel (kernels/prefill_attention.py).
# Call 1's served traces put ~17% of the engine stream's GPU time in a prefill's gathers, GQA
# repeats and masked SDPA, with the soak's GPU busy 99%.
# - its GPU tests (and the engine's, whose prefills now run it) beside the setup;
# - the served A/B on one server each: prefill_kernel false then true, the stream level 256 once,
#   then a 60 s mixed soak;
# - perf/bench_prefill_attention.py: per layer, the old path against the kernel's launch shapes.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c2; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1 &
SETUP=$!
PYTHONPATH=python_backends:tests:. timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_prefill_attention.py tests/test_step_qkv.py tests/test_block_copy.py tests/test_gpu_engine.py > $R/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $((SECONDS-T0)) s: $(tail -1 $R/gpu_tests.txt)"
grep -E "^(FAILED|ERROR)" $R/gpu_tests.txt | head -8
wait $SETUP; tail -1 $R/setup.log; echo "setup done $((SECONDS-T0)) s"
for arm in pk0:false:2 pk1:true:1; do  # name:prefill_kernel:share of the time left
  IFS=: read -r tag value share <<< "$arm"
  TAG=$tag PARAMS=prefill_kernel=$value BENCH=1 LEVELS=256 MODE=stream REPEAT=1 RESPONSE_TIMEOUT=30 \
    timeout $(( (505 - SECONDS + T0) / share )) bash perf/h200_scaling.sh soak 60 2>&1 | tail -2
  echo "$tag $((SECONDS-T0)) s"
done
PYTHONPATH=python_backends:. timeout $((585 - SECONDS + T0)) python3 perf/bench_prefill_attention.py \
  --block-n 32,64 --out $OUT/r13-prefill-attention-call2.json 2>&1 | grep -E "^(best|after|clones|from)" 
echo "bench done $((SECONDS-T0)) s"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
for t in pk0 pk1; do
  python3 -c "import json; [print('$t', l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l.get('underruns_by_chunk'), l['host_steal_cores']) for l in json.load(open('$W/results/bench_soak_${t}_1.json'))]"
  python3 -c "import json; d=json.load(open('$W/results/soak_$t.json')); print('$t soak', d['requests'], d['num_failures'], round(d['audio_seconds']/d['wall_seconds'],1), d['first_audio_ms_p50'], d['first_audio_ms_p95'])"
  python3 -m perf.served_budget $W/results/metrics_series_soak_${t}_load.txt --cpu $W/results/cpu_series_soak_$t.txt | tail -3
done
grep -h "shutdown took\|stub crash" $W/results/scaling.log | tail -4
