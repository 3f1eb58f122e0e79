#!/usr/bin/env bash
# The soak of issue 9 on the H200 machine (device tool), in two calls because one call may run
# 10 minutes at most; the server and the load are started in their own sessions, so they outlive
# the first call (the machine stays warm 30 s between calls):
#   perf/h200_soak.sh start SECONDS   # unpack the pack, tiny checkpoint, serve, start the soak;
#                                     # returns after ~9 min, the soak still running
#   perf/h200_soak.sh finish          # wait for the soak's end checks, SIGTERM the server, check
#                                     # its shutdown; everything lands in $OUT
#   perf/h200_soak.sh run SECONDS     # all in one call (a soak that fits one call's 10 minutes)
#   perf/h200_soak.sh profile SECONDS # one call, with py-spy dumps of the stubs (carry .whl)
# Carry .device (scripts/device_triton_pack.sh builds it). Knobs: CONCURRENCY (256), PROCESSES (8),
# CANCEL (0.2), MIN_FRAMES/MAX_FRAMES (40/112).
set -uo pipefail
cd "$(dirname "$0")/.."
W=/tmp/moss-soak
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*"; }
metrics() { python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=5).read().decode())" 2>/dev/null | grep '^moss_' | sort; }

serve() {
  t0=$SECONDS
  tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
  env | grep -E '^(TRITONSERVER|TRITON_BACKENDS|PERF_ANALYZER|LD_LIBRARY_PATH|MOSS_TTS_STUB_PATH|PYTHONPATH)=' > "$W/env"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
  python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/gpu.txt"
  echo "$MOSS_STACK" | tee -a "$OUT/gpu.txt"
  PYTHONPATH=python_backends python3 -m moss_tts.tools.make_tiny_checkpoint "$W/tiny" > /dev/null
  # A clean copy of the repository: only models with a config (a stale directory left on the
  # machine by an earlier tree made tritonserver refuse to start).
  rm -rf "$W/repo"; mkdir -p "$W/repo"
  for d in model_repository/*/; do [ -f "$d/config.pbtxt" ] && cp -r "$d" "$W/repo/"; done
  log "starting tritonserver on $(ls "$W/repo" | tr '\n' ' ')"
  MODEL_REPOSITORY="$W/repo" PYTHON=python3 MOSS_TTS_MODEL_DIR="$W/tiny/model" MOSS_TTS_CODEC_DIR="$W/tiny/codec" SHIM_PORT=0 \
    setsid scripts/serve.sh > "$W/server.log" 2>&1 < /dev/null &
  echo $! > "$W/server.pid"
  for _ in $(seq 300); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2)" 2>/dev/null && break
    kill -0 "$(cat "$W/server.pid")" 2>/dev/null || { log "server died"; tail -50 "$W/server.log"; cp "$W/server.log" "$OUT/"; exit 1; }
    sleep 1
  done
  log "ready after $((SECONDS - t0)) s"
  python3 -m client.healthcheck --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics --probe | tee "$OUT/health_before.txt"
}

start_soak() {
  log "soak: ${CONCURRENCY:-256} streams, $1 s"
  PYTHONUNBUFFERED=1 setsid python3 -m perf.soak --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics \
    --concurrency "${CONCURRENCY:-256}" --processes "${PROCESSES:-8}" --seconds "$1" \
    --cancel-fraction "${CANCEL:-0.2}" --min-frames "${MIN_FRAMES:-40}" --max-frames "${MAX_FRAMES:-112}" \
    --settle 60 --out "$W/soak.json" > "$W/soak.log" 2>&1 < /dev/null &
}

start() {
  serve
  start_soak "$1"
  while [ $((SECONDS - t0)) -lt 520 ]; do  # watch, then leave with the soak still running
    sleep 60
    log "$(metrics | grep -E 'streams|running|waiting|vocoder_sessions\{state="active"|requests_cancelled|frames_generated' | tr '\n' ' ')"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  done
  metrics > "$OUT/metrics_mid.txt"; cp "$W/server.log" "$OUT/server_mid.log"
}

# One call: serve, soak SECONDS while logging the gauges every minute, then finish.
run() {
  serve
  start_soak "$1"
  while [ ! -s "$W/soak.json" ] && kill -0 "$(cat "$W/server.pid")" 2>/dev/null; do
    sleep 20
    log "$(metrics | grep -E 'streams|running"|vocoder_sessions\{state="active"|requests_cancelled|frames_generated' | tr '\n' ' ')"
  done
  finish
}

# A short soak with py-spy dumps of the stubs while it runs (carry .whl with the py-spy wheel).
profile() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl && export PATH=/tmp/pyspy/bin:$PATH
  serve
  start_soak "$1"
  for k in 1 2 3; do
    sleep $(($1 / 4))
    metrics > "$OUT/metrics_$k.txt"
    for m in moss_tts vocoder; do
      py-spy dump --pid "$(pgrep -f "repo/$m/1/model.py")" > "$W/dump_${m}_$k.txt" 2>&1
    done
    log "$(grep -E 'streams|running"|vocoder_sessions\{state="active"|moss_vocoder\{' "$OUT/metrics_$k.txt" | tr '\n' ' ')"
  done
  tar -czf "$OUT/dumps.tgz" -C "$W" $(cd "$W" && ls dump_*.txt)
  finish
}

finish() {
  set -a; source "$W/env"; set +a
  for _ in $(seq 480); do [ -s "$W/soak.json" ] && break; sleep 1; done
  cp "$W/soak.log" "$OUT/soak.log"
  [ -s "$W/soak.json" ] || { log "the soak did not finish"; exit 1; }
  cp "$W/soak.json" "$OUT/soak.json"
  metrics > "$OUT/metrics_end.txt"
  log "stubs alive: $(pgrep -fc triton_python_backend_stub)"
  local pid t0=$SECONDS; pid=$(cat "$W/server.pid")
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt 60 ]; do sleep 0.2; done
  log "shutdown took $((SECONDS - t0)) s; stubs left: $(pgrep -fc triton_python_backend_stub)"
  cp "$W/server.log" "$OUT/server.log"
  grep -E "Non-graceful|Exit timeout|not healthy|Traceback|invalid pointer|double free|Segmentation|stalled" "$W/server.log" | head -20 \
    || log "server log: none of the failure signs"
  python3 -c "import json; r = json.load(open('$W/soak.json')); print({k: r[k] for k in ('ok', 'requests', 'outcomes', 'num_failures', 'first_audio_ms_p50', 'first_audio_ms_p95', 'audio_seconds', 'wall_seconds', 'end_problems')})"
}

"$@"
