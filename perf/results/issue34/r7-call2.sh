#!/usr/bin/env bash
# Round 7, call 2 (the final code, a fresh machine): setup beside the GPU tests, the codec stage bench,
# then one server: the bench levels twice (1,128,256 streamed and offline). Call 3 may follow warm.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c2; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$SECONDS
(bash perf/h200_scaling.sh setup > $R/setup.log 2>&1) &
PYTHONPATH=python_backends:tests:. timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_window_attention.py \
  tests/test_vocoder_graphs.py tests/test_sample_kernel.py --tb=short > $R/gpu_tests.txt 2>&1
wait; tail -3 $R/gpu_tests.txt; tail -2 $R/setup.log; echo "tests+setup $((SECONDS-T0)) s"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 120 python3 perf/bench_vocoder.py --shapes 1x2,256x10 --rounds 128,256 \
  --iters 10 --skip offline,streaming,equivalence --profile-round 256 --out $R/stage.json > $R/stage.log 2>&1
grep -E "^ +[0-9]+ x|round of|_attention_kernel|_rope_kernel|_ring_write|Self CUDA time total" $R/stage.log | cut -c1-160
echo "stage $((SECONDS-T0)) s"
REPEAT=2 LEVELS=1,128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 timeout 400 bash perf/h200_scaling.sh layout single
echo "levels $((SECONDS-T0)) s"
