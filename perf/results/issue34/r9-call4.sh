#!/usr/bin/env bash
# Round 9, call 4 (the final code, a fresh machine): the engine and vocoder GPU tests beside setup,
# then one server: the levels 1, 128, 256 streamed and offline twice, and one stream 20 requests
# in a row (bench_single_c1.json). Call 5 (the soak) follows warm.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c4; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
(bash perf/h200_scaling.sh setup > $R/setup.log 2>&1) &
PYTHONPATH=python_backends:tests:. timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_engine.py \
  tests/test_vocoder_worker.py --tb=short > $R/gpu_tests.txt 2>&1
wait; tail -3 $R/gpu_tests.txt; tail -1 $R/setup.log; echo "tests+setup $((SECONDS-T0)) s"
C1_REQUESTS=20 REPEAT=2 LEVELS=1,128,256 MODE=stream,offline RESPONSE_TIMEOUT=30 \
  timeout $((570 - SECONDS + T0)) bash perf/h200_scaling.sh layout single
echo "levels $((SECONDS-T0)) s"
grep -h "first_audio_hold" $W/results/metrics_single.txt 2>/dev/null | head -3
