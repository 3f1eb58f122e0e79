#!/usr/bin/env bash
# Round 8, call 1 (the profile, main c8d6d45 + METRICS_INTERVAL): setup, the codec round's replay
# against its host staging, then one server: stream levels 1 and 256 twice, with the first-audio
# trace, the counters every 0.25 s and py-spy records of the moss_tts stub (run 1: the GIL holder;
# run 2: every thread, idle included). Carry .device and .whl.
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -2 $R/setup.log; echo "setup $((SECONDS-T0)) s"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 100 python3 perf/bench_vocoder.py --shapes 1x2 --rounds 256 \
  --iters 10 --skip offline,streaming,equivalence --profile-round 256 --out $R/stage.json > $R/stage.log 2>&1
grep -E "^ +[0-9]+ x|round|replay|stage_host|Self CUDA time total" $R/stage.log | cut -c1-200 | head -30
echo "stage $((SECONDS-T0)) s"
METRICS_INTERVAL=0.25 TRACE=1 REPEAT=2 LEVELS=1,256 MODE=stream RECORD=0:14:gil,15:14:all RESPONSE_TIMEOUT=30 \
  timeout 300 bash perf/h200_scaling.sh layout single
echo "levels $((SECONDS-T0)) s"
