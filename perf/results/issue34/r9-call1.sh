#!/usr/bin/env bash
# Round 9, call 1: fp8 weights for the engine's backbone (5772069). GPU tests (the fp8 kernel at
# the model's sizes, _scaled_mm against the dequantized product, fp8 graphed == eager, the engine's
# GPU tests), then bench_engine's step and split at batch 1 and 256 in bf16 and with --fp8 (that run
# also profiles one fp8 step and measures fp8 and bf16 against fp32). No server.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
T0=$SECONDS
PYTHONPATH=python_backends:tests:. timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fp8_linear.py \
  tests/test_gpu_engine.py --tb=short > $R/gpu_tests.txt 2>&1
tail -25 $R/gpu_tests.txt | cut -c1-300; echo "tests $((SECONDS-T0)) s"
SKIP=equivalence,offline,latency,probe,naive,prefix,fp32
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 150 python3 perf/bench_engine.py --batches 1,256 \
  --skip $SKIP,profile,fp8 --out $R/engine_bf16 > $R/engine_bf16.log 2>&1
grep -E "decode step|split|ERROR" $R/engine_bf16.log | cut -c1-250; echo "bf16 bench $((SECONDS-T0)) s"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 200 python3 perf/bench_engine.py --fp8 --batches 1,256 \
  --skip $SKIP --out $R/engine_fp8 > $R/engine_fp8.log 2>&1
grep -E "decode step|split|vs fp32|profile|ERROR" $R/engine_fp8.log | cut -c1-600; echo "fp8 bench $((SECONDS-T0)) s"
cp $R/engine_bf16/bench.json $OUT/engine_bf16.json 2>/dev/null; cp $R/engine_fp8/bench.json $OUT/engine_fp8.json 2>/dev/null
cp $R/engine_fp8/profile.txt $OUT/engine_fp8_profile.txt 2>/dev/null
