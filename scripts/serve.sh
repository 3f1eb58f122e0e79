#!/usr/bin/env bash
# Serve: make sure a checkpoint exists, then start tritonserver on model_repository/.
#   MOSS_TTS_MODEL_DIR  MOSS-TTS-Local-Transformer-v1.5 directory (default: tiny random demo)
#   MOSS_TTS_CODEC_DIR  MOSS-Audio-Tokenizer-v2 directory (default: from the model config)
#   HTTP_PORT / GRPC_PORT / METRICS_PORT (default 8000 / 8001 / 8002)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${MOSS_TTS_MODEL_DIR:-}" ]; then
  want=$(PYTHONPATH=python_backends .venv/bin/python -c \
    "from moss_tts.tools.make_tiny_checkpoint import TINY_CHECKPOINT_VERSION as v; print(v)")
  if [ "$(cat checkpoints/tiny/VERSION 2>/dev/null)" != "$want" ]; then
    rm -rf checkpoints/tiny
    PYTHONPATH=python_backends .venv/bin/python -m moss_tts.tools.make_tiny_checkpoint checkpoints/tiny
  fi
  export MOSS_TTS_MODEL_DIR="$PWD/checkpoints/tiny/model"
  echo "!!! MOSS_TTS_MODEL_DIR is not set: serving the TINY RANDOM-WEIGHT demo checkpoint. Its audio is NOISE."
  echo "!!! For real speech: hf download OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5 --local-dir M"
  echo "!!!                  hf download OpenMOSS-Team/MOSS-Audio-Tokenizer-v2 --local-dir C"
  echo "!!!                  MOSS_TTS_MODEL_DIR=M MOSS_TTS_CODEC_DIR=C make serve"
fi
source scripts/triton_env.sh
exec "$TRITONSERVER" --model-repository="$PWD/model_repository" --backend-directory="$TRITON_BACKENDS" \
  --http-port="${HTTP_PORT:-8000}" --grpc-port="${GRPC_PORT:-8001}" --metrics-port="${METRICS_PORT:-8002}" \
  --log-verbose=0 "$@"
