#!/usr/bin/env bash
# Round 8, call 3 (the final code, a fresh machine): setup beside the GPU tests; the codec stage with
# the SM clock and power sampled every 100 ms (round replay back to back against one replay after an
# idle second), the 1 x 2 step without split-K (cuBLASLt); then one server: the bench levels twice
# (1,128,256 streamed and offline). Call 4 (the soak) may follow warm.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c3; mkdir -p $R
trap 'kill $SMI 2>/dev/null; tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
(bash perf/h200_scaling.sh setup > $R/setup.log 2>&1) &
PYTHONPATH=python_backends:tests:. timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_window_attention.py \
  tests/test_vocoder_graphs.py tests/test_sample_kernel.py tests/test_decode_attention.py --tb=short > $R/gpu_tests.txt 2>&1
wait; tail -3 $R/gpu_tests.txt; tail -1 $R/setup.log; echo "tests+setup $((SECONDS-T0)) s"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader \
  -lms 100 > $R/clocks_stage.txt 2>&1 &
SMI=$!
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 120 python3 perf/bench_vocoder.py --shapes 1x2,256x10 --rounds 128,256 \
  --iters 10 --skip offline,streaming,equivalence --profile-round 256 --out $R/stage.json > $R/stage.log 2>&1
grep -E "^ +[0-9]+ x|round of|Self CUDA time total" $R/stage.log | cut -c1-260
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 60 python3 perf/bench_vocoder.py --shapes 1x2 --rounds "" --iters 20 \
  --skip offline,streaming,equivalence --profile 1x2 --splitk off --out $R/stage_splitk_off.json > $R/stage_splitk_off.log 2>&1
grep -E "^ +1 x 2|splitK|Self CUDA time total|ERROR" $R/stage_splitk_off.log | cut -c1-200
kill $SMI; echo "stage $((SECONDS-T0)) s"
REPEAT=2 LEVELS=1,128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 timeout 330 bash perf/h200_scaling.sh layout single
echo "levels $((SECONDS-T0)) s"
