#!/usr/bin/env bash
# A short perf_analyzer run against the moss_tts entry over gRPC streaming.
#   perf/perf_analyzer_smoke.sh [GRPC_URL] [OUT_DIR]
# Each request asks for 8 frames (0.64 s) with IGNORE_STOP so the work per request is fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
URL=${1:-localhost:8001}
OUT=${2:-build/perf}
mkdir -p "$OUT"
source scripts/triton_env.sh
"$PERF_ANALYZER" -m moss_tts -u "$URL" -i grpc --streaming \
  --input-data perf/inputs/short_utterance.json \
  --concurrency-range 1:2 --measurement-mode count_windows --measurement-request-count 4 \
  --max-trials 3 --stability-percentage 999 -f "$OUT/perf.csv"
