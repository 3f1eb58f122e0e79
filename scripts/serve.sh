#!/usr/bin/env bash
# Serve: make sure a checkpoint exists, then start the server.
# STUB until the Triton pipeline lands: there is no model_repository/ yet, so this builds the
# tiny demo checkpoint and runs one offline synthesis with it instead of starting tritonserver.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR=${MOSS_TTS_MODEL_DIR:-}
if [ -z "$MODEL_DIR" ]; then
  if [ ! -f checkpoints/tiny/model/model.safetensors ]; then
    PYTHONPATH=python_backends .venv/bin/python -m moss_tts.tools.make_tiny_checkpoint checkpoints/tiny
  fi
  MODEL_DIR=checkpoints/tiny/model
  echo "!!! MOSS_TTS_MODEL_DIR is not set: using the TINY RANDOM-WEIGHT demo checkpoint. Its audio is NOISE."
  echo "!!! For real speech: hf download OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5 --local-dir M;"
  echo "!!!                  hf download OpenMOSS-Team/MOSS-Audio-Tokenizer-v2 --local-dir C;"
  echo "!!!                  MOSS_TTS_MODEL_DIR=M MOSS_TTS_CODEC_DIR=C make serve"
fi
CODEC_ARGS=()
[ -n "${MOSS_TTS_CODEC_DIR:-}" ] && CODEC_ARGS=(--codec "$MOSS_TTS_CODEC_DIR")
echo "tritonserver is not wired up yet (stub): running one offline synthesis to build/out.wav instead."
mkdir -p build
PYTHONPATH=python_backends exec .venv/bin/python -m moss_tts.generate --model "$MODEL_DIR" "${CODEC_ARGS[@]}" \
  --text "Hello from MOSS-TTS." --seed 0 --max-frames 50 --out-wav build/out.wav
