#!/usr/bin/env bash
# Serve: make sure a checkpoint exists, then start tritonserver on model_repository/ and, next to
# it, the OpenAI-compatible speech API (python -m client.openai_shim). Ctrl-C / SIGTERM stops both;
# either one exiting stops the other.
#   MOSS_TTS_MODEL_DIR  MOSS-TTS-Local-Transformer-v1.5 directory (default: tiny random demo)
#   MOSS_TTS_CODEC_DIR  MOSS-Audio-Tokenizer-v2 directory (default: from the model config)
#   HTTP_PORT / GRPC_PORT / METRICS_PORT (default 8000 / 8001 / 8002)
#   SHIM_PORT           OpenAI-compatible API port (default 8080; 0 = tritonserver only)
#   SHIM_WORKERS        the API's worker processes on that port (default: one per usable core, at
#                       most 8: client/openai_shim/workers.py; 1 = one process)
#   VOICES_DIR          the shim's saved voices (default: voices/ in the checkout)
#   SHIM_ARGS           extra shim flags, e.g. "--reference-dir /data/refs --allow-url-references"
#   MODEL_REPOSITORY    another model repository (default: model_repository/), e.g. a copy with
#                       other capacities
#   PYTHON              the interpreter (default .venv/bin/python); with TRITONSERVER and
#                       TRITON_BACKENDS already set (the device pack's env.sh) scripts/triton_env.sh
#                       is not sourced
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
if [ -z "${MOSS_TTS_MODEL_DIR:-}" ]; then
  want=$(PYTHONPATH=python_backends "$py" -c \
    "from moss_tts.tools.make_tiny_checkpoint import TINY_CHECKPOINT_VERSION as v; print(v)")
  if [ "$(cat checkpoints/tiny/VERSION 2>/dev/null)" != "$want" ]; then
    rm -rf checkpoints/tiny
    PYTHONPATH=python_backends "$py" -m moss_tts.tools.make_tiny_checkpoint checkpoints/tiny
  fi
  export MOSS_TTS_MODEL_DIR="$PWD/checkpoints/tiny/model"
  echo "!!! MOSS_TTS_MODEL_DIR is not set: serving the TINY RANDOM-WEIGHT demo checkpoint. Its audio is NOISE."
  echo "!!! For real speech: hf download OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5 --local-dir M"
  echo "!!!                  hf download OpenMOSS-Team/MOSS-Audio-Tokenizer-v2 --local-dir C"
  echo "!!!                  MOSS_TTS_MODEL_DIR=M MOSS_TTS_CODEC_DIR=C make serve"
fi
shim=("$py" -m client.openai_shim --port "${SHIM_PORT:-8080}" --triton-url "127.0.0.1:${GRPC_PORT:-8001}"
  --metrics-url "http://127.0.0.1:${METRICS_PORT:-8002}/metrics" --voices-dir "${VOICES_DIR:-$PWD/voices}"
  ${SHIM_WORKERS:+--workers "$SHIM_WORKERS"})
[ -n "${TRITONSERVER:-}" ] && [ -n "${TRITON_BACKENDS:-}" ] || source scripts/triton_env.sh
# The pipeline's own requests carry this key (python_backends/moss_tts/vocoder/internal_key.py);
# a new one per start, shared by every model of this server through the environment.
export MOSS_TTS_INTERNAL_KEY="${MOSS_TTS_INTERNAL_KEY:-$("$py" -c 'import secrets; print(secrets.token_hex(32))')}"
# thread-pool-size is per model instance; a moss_tts stream holds one of its threads while it
# waits on a BLS call or a send, so it must exceed moss_tts max_streams (320;
# tests/test_capacity_config.py checks it).
# --disable-auto-complete-config: every config.pbtxt is complete and no model.py completes one, and
# with it on the python backend starts a stub per model just to ask (one more import of torch and
# the package per model: 19.6 s -> 7.5 s to ready on the 2-core machine).
triton=("$TRITONSERVER" --model-repository="${MODEL_REPOSITORY:-$PWD/model_repository}" --backend-directory="$TRITON_BACKENDS"
  --http-port="${HTTP_PORT:-8000}" --grpc-port="${GRPC_PORT:-8001}" --metrics-port="${METRICS_PORT:-8002}"
  --backend-config=python,thread-pool-size=384 --disable-auto-complete-config --log-verbose=0 "$@")
if [ "${SHIM_PORT:-8080}" = "0" ]; then
  exec "${triton[@]}"
fi
# Background jobs of a script ignore SIGINT, so Ctrl-C reaches only this shell: the trap passes it on.
"${triton[@]}" &
triton_pid=$!
env -u LD_LIBRARY_PATH -u MOSS_TTS_INTERNAL_KEY "${shim[@]}" ${SHIM_ARGS:-} &
shim_pid=$!
echo "OpenAI-compatible speech API on http://localhost:${SHIM_PORT:-8080}/v1/audio/speech (pid $shim_pid; its workers under it)"
stop_both() { kill -TERM "$triton_pid" "$shim_pid" 2>/dev/null || true; }
trap stop_both INT TERM
status=0
wait -n "$triton_pid" "$shim_pid" || status=$?
stop_both
wait "$triton_pid" "$shim_pid" 2>/dev/null || true
exit "$status"
