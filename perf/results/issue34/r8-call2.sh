#!/usr/bin/env bash
# Round 8, call 2 (one machine): setup beside the GPU tests of the changed parts; the served A/B of
# main (c8d6d45, .device/ab/main-c8d6d45.tar.xz, run with this tree's h200_scaling.sh) against this
# tree (the urgent vocoder stream), stream levels 1/128/256 once each plus 20 single-stream requests;
# then the decode attention sweep and the codec stage (round split, 1 x 2 census, split-K on/off).
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c2; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$SECONDS
(bash perf/h200_scaling.sh setup > $R/setup.log 2>&1) &
PYTHONPATH=python_backends:tests:. timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_vocoder_worker.py \
  tests/test_decode_attention.py --tb=short > $R/gpu_tests.txt 2>&1
wait; tail -3 $R/gpu_tests.txt; tail -1 $R/setup.log; echo "tests+setup $((SECONDS-T0)) s"
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xJf .device/ab/main-c8d6d45.tar.xz -C /tmp/old && cp perf/h200_scaling.sh /tmp/old/perf/
C1_REQUESTS=20 METRICS_INTERVAL=0.25 TRACE=1 REPEAT=1 LEVELS=1,128,256 MODE=stream RESPONSE_TIMEOUT=30 \
  timeout 330 bash perf/h200_scaling.sh trees /tmp/old > $R/trees.log 2>&1
grep -E "^\| stream|ready after|phase|grpc_stream" $R/trees.log | head -40
echo "trees $((SECONDS-T0)) s"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 100 python3 perf/bench_decode_attention.py --stages 2,3 \
  --out $R/decode_attention.json > $R/decode_attention.log 2>&1; grep -E "best|default\)" $R/decode_attention.log
echo "sweep $((SECONDS-T0)) s"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 90 python3 perf/bench_vocoder.py --shapes 1x2 --rounds 256 --iters 10 \
  --skip offline,streaming,equivalence --profile 1x2 --out $R/stage_on.json > $R/stage_on.log 2>&1
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 60 python3 perf/bench_vocoder.py --shapes 1x2 --rounds "" --iters 20 \
  --skip offline,streaming,equivalence --profile 1x2 --splitk off --out $R/stage_off.json > $R/stage_off.log 2>&1
grep -E "^ +1 x 2|round of|Memset|Self CUDA time total" $R/stage_on.log $R/stage_off.log | cut -c1-220
echo "stage $((SECONDS-T0)) s"
