#!/usr/bin/env bash
# Multi-GPU scaling of the served pipeline (issue 12) on the device tool's nvidia-h200-x2 machine:
# the same model repository under three placements, each measured with perf/bench_triton.py on
# the real-size random checkpoint (bf16), all five models in tritonserver.
#   perf/h200_scaling.sh setup                 # unpack the pack (carry .device), write the
#                                              # real-size checkpoint (~12 GB) to /tmp
#   perf/h200_scaling.sh vocoder               # codec GPU tests + perf/bench_vocoder.py (once per
#                                              # fusion in FUSIONS, e.g. "none ln_lt_gelu")
#   perf/h200_scaling.sh layout NAME [NAME..]  # single | replicas_2gpu | split_2gpu: serve,
#                                              # bench REPEAT times (1), kill; bench_NAME_K.json,
#                                              # metrics, GPU utilization + logs in results.tgz;
#                                              # TAG=x: files bench_NAME_x_K.json ... instead
#   AB="a:k=v,...;b:k=v,..." perf/h200_scaling.sh ab   # the single layout once per variant, each
#                                              # with its PARAMS, files tagged a, b (an A/B of
#                                              # moss_tts parameters on one machine)
#   AB=... AB_UNTIL=EPOCH_S perf/h200_scaling.sh ab_soak SECONDS   # the soak (and BENCH levels)
#                                              # once per variant, the time left shared out
#   perf/h200_scaling.sh trees DIR             # the single layout from this tree (TAG newK) and from
#                                              # the tree in DIR (TAG oldK), alternating ROUNDS (1) times,
#                                              # each round's first tree the other's (FIRST=new|old)
#   perf/h200_scaling.sh soak SECONDS          # single layout, perf/soak.py (the mixed load: cancels,
#                                              # bad input, clones, continuations, codes, ensemble,
#                                              # offline) at CONCURRENCY (256), then SIGTERM + checks;
#                                              # soak.log: a progress line per client process every
#                                              # 10 s; host_series_NAME.txt: memory, /dev/shm, RSS
#   BENCH=1 perf/h200_scaling.sh soak SECONDS  # the single layout's bench levels first, then the
#                                              # soak, against one server (one device call)
#   perf/h200_scaling.sh shim                  # single layout with the OpenAI shim: perf/shim_load.py,
#                                              # gRPC bench + shim HTTP pcm + text sessions over gRPC
#                                              # and the shim's WebSocket (shim_K.json, REPEAT runs)
#   perf/h200_scaling.sh all                   # setup, vocoder, then every layout
# SERVER_CPUS, CLIENT_CPUS: the server and the clients on separate cores (below).
# PARAMS="key=value,..." (any layout): moss_tts config.pbtxt parameters changed for the run.
# BENCH_ARGS: more perf/bench_triton.py arguments (e.g. --start-together); VARIANT_ARGS: each bench
# run followed by one with these instead (bench_NAME_v_K.json); RECORD_RATE: py-spy samples a
# second for RECORD (50).
# TRACE=1 (layout, ab): the server's first-audio trace cut by the bench's levels (trace_phases_NAME.json).
# GPU_TRACE="AT:SECONDS,..." (soak): the moss_tts stub's CUDA kernels for SECONDS from AT s into the
# soak (serving/gpu_trace.py), each cut into the GPU budget (gpu_budget_NAME_ATs.json / .txt,
# perf/gpu_trace_budget.py); the traces themselves go to $OUT when it is set.
# C1_REQUESTS=N (layout, ab, trees): after the levels, one stream of N requests (bench_NAME_c1.json).
# VOCODER=bls (single): moss_tts calls the vocoder model over BLS (288 slots) instead of decoding
# in its own process (the comparison of docs/scaling.md).
# single = config.pbtxt with only GPU 0 visible; the others = --model-config-name=NAME
# (model_repository/*/configs/NAME.pbtxt). Knobs: LEVELS (1,128,256,512), REQUESTS (2 per
# worker), PROCESSES (8 client processes), FRAMES (112), MODE (stream).
set -uo pipefail
cd "$(dirname "$0")/.."
W=/tmp/moss-scale
R=$W/results  # kept across the calls of one machine; each call returns it whole as results.tgz
OUT=${OUT:-$W/out}
mkdir -p "$W" "$R" "$OUT"
# The device returns at most 8 files: one archive and the running log.
# The servers' logs go in too: a call cut by its time limit still returns them. SAMPLERS: the
# soak's background samplers, stopped first so none writes the archive after this.
SAMPLERS=""
trap 'kill $SAMPLERS 2>/dev/null; cp "$W"/server_*.log "$R/" 2>/dev/null; rm -f "$OUT/results.tgz.part"
  tar -czf "$OUT/results.tgz" -C "$W" results; cp "$R/scaling.log" "$OUT/" 2>/dev/null' EXIT
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$R/scaling.log"; }
# SERVER_CPUS / CLIENT_CPUS (e.g. 0-11 / 12-15): tritonserver with its stubs, and the bench's or
# the soak's client processes, each on cores of their own (taskset), as when the load comes from
# other machines; unset: both anywhere, sharing the machine's cores as before.
SERVER_PIN=${SERVER_CPUS:+taskset -c $SERVER_CPUS}
CLIENT_PIN=${CLIENT_CPUS:+taskset -c $CLIENT_CPUS}

env_pack() {
  [ -f /opt/moss-pack/env.sh ] || tar -xJf .device/triton-pack.tar.xz -C /opt
  source /opt/moss-pack/env.sh
}

setup() {
  local t0=$SECONDS
  env_pack
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$R/gpu.txt"
  python3 -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)" | tee -a "$R/gpu.txt"
  echo "$MOSS_STACK" | tee -a "$R/gpu.txt"; log "$MOSS_STACK"
  if [ ! -f "$W/ckpt/codec/model.safetensors" ]; then
    rm -rf "$W/ckpt"
    PYTHONPATH=python_backends python3 -m moss_tts.tools.make_tiny_checkpoint --real-size "$W/ckpt" || { log "checkpoint failed"; exit 1; }
  fi
  du -sh "$W/ckpt/model" "$W/ckpt/codec" | tee -a "$R/gpu.txt"
  # What kind of host this is (cores, one core's Python, a GIL hand-off's wait): machines differ.
  python3 perf/host_probe.py --out "$R/host_probe.json" | tee -a "$R/scaling.log"
  log "setup took $((SECONDS - t0)) s"
}

# The codec's GPU tests (kernels vs reference, graphs == eager, streaming == offline), then
# perf/bench_vocoder.py (VOCODER_ARGS, default: its default shapes, offline 32x100, and a profile
# of one eager 256x10 step). FUSIONS="a b": one bench per codec fusion, vocoder_a.json ... (the
# stage side of a fusion A/B, on one machine). The JSONs go in results.tgz; vocoder.json (one
# fusion) also lands in $OUT by itself.
vocoder() {
  env_pack
  PYTHONPATH=python_backends:tests:. python3 -m pytest -q -m gpu tests/test_window_attention.py tests/test_vocoder_graphs.py \
    tests/test_codec.py tests/test_layer_norm.py tests/test_vocoder_sessions.py 2>&1 | tee "$R/gpu_tests.txt" | tail -15
  local fusion name
  for fusion in ${FUSIONS:-default}; do
    name=vocoder${FUSIONS:+_$fusion}
    log "bench_vocoder: $name"
    PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 python3 perf/bench_vocoder.py ${VOCODER_ARGS:---profile 256x10} \
      ${FUSIONS:+--fusion $fusion} --out "$R/$name.json" 2>&1 | tee "$R/$name.txt"
  done
  [ -z "${FUSIONS:-}" ] && cp "$R/vocoder.json" "$OUT/" 2>/dev/null
  return 0
}

# The model repository as served: VOCODER=bls switches moss_tts to the vocoder model (which then
# needs a slot per engine row, and moss_tts no longer holds the codec, so the old reserve).
prepare_repo() {
  rm -rf "$W/repo"; mkdir -p "$W/repo"
  for d in model_repository/*/; do [ -f "$d/config.pbtxt" ] && cp -r "$d" "$W/repo/"; done
  if [ "${VOCODER:-in_process}" = bls ]; then
    sed -i 's/key: "vocoder" value: { string_value: "in_process" }/key: "vocoder" value: { string_value: "bls" }/;
            s/key: "reserved_memory_gib" value: { string_value: "[0-9]*" }/key: "reserved_memory_gib" value: { string_value: "40" }/' \
      "$W/repo/moss_tts/config.pbtxt"
    sed -i 's/key: "max_slots" value: { string_value: "[0-9]*" }/key: "max_slots" value: { string_value: "288" }/' \
      "$W/repo/vocoder/config.pbtxt"
  fi
  # PARAMS="key=value,...": moss_tts parameters changed for this run (an A/B of one knob).
  local params=${PARAMS:-}
  for kv in ${params//,/ }; do
    grep -q "key: \"${kv%%=*}\" value" "$W/repo/moss_tts/config.pbtxt" || { log "PARAMS: no parameter ${kv%%=*}"; exit 1; }
    sed -i "s/key: \"${kv%%=*}\" value: { string_value: \"[^\"]*\" }/key: \"${kv%%=*}\" value: { string_value: \"${kv#*=}\" }/" \
      "$W/repo/moss_tts/config.pbtxt"
  done
  grep -E 'key: "(vocoder|reserved_memory_gib|max_slots|gil_switch_interval_ms|chunk_frames|vocoder_round_rows|vocoder_round_min_frames|vocoder_hold_ms)"' \
    "$W/repo/moss_tts/config.pbtxt" "$W/repo/vocoder/config.pbtxt" | tee -a "$R/scaling.log"
}

stop_server() {
  local pid; pid=$(cat "$W/server.pid" 2>/dev/null) || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  # The numbers are taken; the drain of a loaded server is tests/test_shutdown.py's business.
  pkill -9 -f tritonserver; pkill -9 -f triton_python_backend_stub; sleep 2
}

# A server (and its stubs, its load) left by an earlier run that a `timeout` cut short: its
# serve.sh ran under setsid, out of the timeout's reach, and would answer the next server's
# readiness polls on the same ports. Killed, and the ports waited for, before a server starts.
clear_leftovers() {
  if pgrep -f "tritonserver|triton_python_backend_stub|perf.soak|perf/bench_triton" > /dev/null; then
    log "clearing a server or load left running by an earlier run"
    pkill -9 -f "perf.soak|perf/bench_triton"; pkill -9 -f tritonserver; pkill -9 -f triton_python_backend_stub
  fi
  for _ in $(seq 30); do
    python3 -c "import socket, sys; [socket.create_connection(('127.0.0.1', p), 0.2) for p in (8000, 8001, 8002)]" \
      2>/dev/null || return 0
    sleep 1
  done
  log "ports 8000-8002 still answer after 30 s"
}

# wait_ready URL...: until every URL answers 200 (tritonserver's readiness, the shim's health), for
# at most 8 minutes; 1 (not ready) as soon as the server that $W/server.pid names has died.
wait_ready() {
  local urls="$*"
  for _ in $(seq 480); do
    python3 -c "import sys, urllib.request; [urllib.request.urlopen(u, timeout=2) for u in sys.argv[1:]]" $urls \
      2>/dev/null && return 0
    kill -0 "$(cat "$W/server.pid")" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}

# py-spy dumps of the moss_tts and vocoder stubs at PYSPY seconds into the levels (comma-separated;
# carry .whl with the py-spy wheel): where the stubs' threads are while the load runs.
dump_stubs() {
  [ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl
  local last=0
  for at in ${PYSPY//,/ }; do
    sleep $((at - last)); last=$at
    for pid in $(pgrep -f "repo/(moss_tts|vocoder)/1/model.py"); do
      /tmp/pyspy/bin/py-spy dump --pid "$pid" > "$R/dump_$1_${at}s_$pid.txt" 2>&1
    done
  done
}

# Engine, in-process vocoder and garbage-collection counters every METRICS_INTERVAL s (0.5; the stub
# publishes them every 0.25 s) while the levels run (rates per level), with
# each model's heartbeat and moss_tts's queue in Triton (a stall shows which side stopped).
sample_metrics() {
  while :; do
    echo "t $(date +%s.%N)"
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=2).read().decode())" \
      2>/dev/null | grep -E '^moss_(engine|tts_vocoder|tts_gc)\{|^moss_heartbeat_total|^nv_inference_pending_request_count\{model="moss_tts"' \
      | sed -E 's/\{model_instance="[^"]*",stat="([a-z_]+)"\}/ \1/'
    sleep "${METRICS_INTERVAL:-0.5}"
  done > "$R/metrics_series_$1.txt"
}

# GPU traces of the moss_tts stub while the soak runs (GPU_TRACE="AT:SECONDS,...", AT s from the
# soak's start): each asked for by name, waited for (2 min at most), cut into the GPU budget.
gpu_trace() {
  local dir="$W/gputrace_$1" at dur t0=$SECONDS name
  for spec in ${GPU_TRACE//,/ }; do
    IFS=: read -r at dur <<< "$spec"
    name="$1_${at}s"
    [ $((t0 + at - SECONDS)) -gt 0 ] && sleep $((t0 + at - SECONDS))
    echo "$dur $name" > "$dir/request.tmp" && mv "$dir/request.tmp" "$dir/request"  # whole, never half-written
    for _ in $(seq 240); do { [ -e "$dir/$name.json.gz" ] || [ -e "$dir/$name.error" ]; } && break; sleep 0.5; done
    if [ -e "$dir/$name.json.gz" ]; then
      python3 perf/gpu_trace_budget.py "$dir/$name.json.gz" --out "$R/gpu_budget_$name.json" > "$R/gpu_budget_$name.txt" 2>&1
      if [ -n "${OUT:-}" ] && [ "$(stat -c %s "$dir/$name.json.gz")" -lt 15000000 ]; then cp "$dir/$name.json.gz" "$OUT/gputrace_$name.json.gz"
      else echo "trace $name ($(stat -c %s "$dir/$name.json.gz") bytes) not copied to \$OUT" >> "$R/gpu_budget_$name.txt"; fi
    else
      cat "$dir/$name.error" > "$R/gpu_budget_$name.txt" 2>/dev/null || echo "no trace $name within 120 s" > "$R/gpu_budget_$name.txt"
    fi
  done
}

# py-spy records of the moss_tts stub (RECORD="START:SECONDS[:MODE],..." from the load's start;
# carry .whl): collapsed stacks per thread, where the stub's Python time goes. MODE: gil (only the
# thread holding the GIL), native (every thread with its C frames, e.g. take_gil: pauses the
# process at each sample), none = every thread, idle ones too. gil and none use --nonblocking, so
# the load's own numbers stand while they run.
record_stub() {
  [ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl
  local pid last=0 flags; pid=$(pgrep -f "/moss_tts/1/model\.py" | head -1)
  for spec in ${RECORD//,/ }; do
    IFS=: read -r at dur mode <<< "$spec"
    sleep $((at - last)); last=$((at + dur))
    case "$mode" in
      gil) flags="--gil --nonblocking" ;;
      native) flags="--native --idle" ;;
      *) flags="--idle --nonblocking"; mode=all ;;
    esac
    /tmp/pyspy/bin/py-spy record --pid "$pid" -d "$dur" -r "${RECORD_RATE:-50}" -f raw --threads $flags -o "$R/record_$1_${at}s_$mode.txt" \
      > "$R/record_$1_${at}s_$mode.log" 2>&1
  done
}

# One perf/bench_triton.py run against the server now up: bench_triton OUT.json ARGS...
bench_triton() {
  local out=$1; shift
  PYTHONUNBUFFERED=1 $CLIENT_PIN python3 -m perf.bench_triton --url 127.0.0.1:8001 --frames "${FRAMES:-112}" --warmup 2 \
    --timeout 120 "$@" --out "$out" 2>&1 | tee -a "$R/scaling.log"
}

# REPEAT runs of the bench levels against the server now up (the spread of runs):
# bench_runs NAME LEVELS MODE writes bench_NAME_K.json.
bench_runs() {
  local levels=(--concurrency "$2" --mode "$3" --requests "${REQUESTS:-2}" --processes "${PROCESSES:-8}")
  for k in $(seq "${REPEAT:-1}"); do
    log "$1: bench run $k"
    bench_triton "$R/bench_$1_$k.json" "${levels[@]}" ${BENCH_ARGS:-}
    # VARIANT_ARGS: each run followed by one with these bench_triton arguments instead of
    # BENCH_ARGS (bench_NAME_v_K.json): an A/B of the client's method on one server.
    if [ -n "${VARIANT_ARGS:-}" ]; then
      log "$1: bench run $k, variant: $VARIANT_ARGS"
      bench_triton "$R/bench_$1_v_$k.json" "${levels[@]}" $VARIANT_ARGS
    fi
  done
}

# The host probe (one core's Python, ~1 s) on the idle host before a layout's server starts and after
# it stops: round 23 found one H200's probe at 32 ms, then at 60 ms eight minutes later, and its
# levels fell to a slow host's. Setup's probe alone cannot show that drift: layout_probe NAME WHEN.
layout_probe() {
  python3 perf/host_probe.py --out "$R/host_probe_$1_$2.json" > /dev/null 2>&1 &&
    log "layout $1: host probe $2: $(python3 -c "import json; d = json.load(open('$R/host_probe_$1_$2.json')); \
print(d['python_ms'], 'ms Python,', d['regain_us_8']['p50'], 'us GIL regain (8 threads)')")"
}

layout() {
  env_pack
  prepare_repo  # a clean copy of the repository: only models with a config
  for name in "$@"; do
    # BUDGET_S: seconds this call may still use; a layout needs ~4 min (load, levels, stop).
    if [ $((SECONDS + ${LAYOUT_S:-240})) -gt "${BUDGET_S:-100000}" ]; then log "layout $name: skipped (call budget)"; continue; fi
    local t0=$SECONDS extra=() visible=0,1 n="$name${TAG:+_$TAG}"
    clear_leftovers
    layout_probe "$n" before
    case "$name" in
      single) visible=0 ;;
      *) extra=(--model-config-name="$name") ;;
    esac
    log "layout $name: starting tritonserver (CUDA_VISIBLE_DEVICES=$visible ${extra[*]:-})"
    # TRACE=1: the server traces every request's first audio, cut by level below (trace_phases_NAME.json).
    local trace=""; [ "${TRACE:-0}" = 1 ] && trace="$R/first_audio_trace_$n.jsonl"
    CUDA_VISIBLE_DEVICES=$visible MODEL_REPOSITORY="$W/repo" PYTHON=python3 MOSS_TTS_MODEL_DIR="$W/ckpt/model" \
      MOSS_TTS_CODEC_DIR="$W/ckpt/codec" SHIM_PORT=0 MOSS_TTS_FIRST_AUDIO_TRACE="$trace" \
      setsid $SERVER_PIN scripts/serve.sh "${extra[@]}" > "$W/server_$n.log" 2>&1 < /dev/null &
    echo $! > "$W/server.pid"
    local ready=0
    wait_ready http://127.0.0.1:8000/v2/health/ready && ready=1
    cp "$W/server_$n.log" "$R/"
    if [ $ready = 0 ]; then log "layout $name: server not ready"; tail -40 "$W/server_$n.log"; stop_server; continue; fi
    log "layout $name: ready after $((SECONDS - t0)) s"
    grep -E "memory plan|captured|vocoder graphs|device" "$W/server_$n.log" | head -20 | tee -a "$R/scaling.log"
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tee -a "$R/scaling.log"
    [ -n "${PYSPY:-}" ] && dump_stubs "$n" &
    [ -n "${RECORD:-}" ] && record_stub "$n" &
    sample_metrics "$n" &
    local sampler=$!
    python3 perf/cpu_sample.py --interval 2 > "$R/cpu_series_$n.txt" 2>&1 &
    local cpu=$!
    # GPU busy fraction, SM clock, power and temperature every 0.5 s while the levels run
    # (time stamps line up with scaling.log).
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm,power.draw,temperature.gpu \
      --format=csv,noheader -lms 500 > "$R/gpu_util_$n.txt" 2>&1 &
    local smi=$!
    bench_runs "$n" "${LEVELS:-1,128,256,512}" "${MODE:-stream}"
    # C1_REQUESTS=N: then one stream N requests in a row (bench_NAME_c1.json): first audio at
    # concurrency 1 from more than the levels' 2 requests.
    if [ -n "${C1_REQUESTS:-}" ]; then
      log "$n: one stream, $C1_REQUESTS requests"
      bench_triton "$R/bench_${n}_c1.json" --concurrency 1 --mode stream --requests "$C1_REQUESTS" --processes 1
    fi
    kill "$smi" "$sampler" "$cpu" 2>/dev/null
    python3 perf/cpu_sample.py --summary "$R/cpu_series_$n.txt" | sed 's/^/cpu (cores, the levels): /' | tee -a "$R/scaling.log"
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=5).read().decode())" \
      > "$W/metrics_$n.txt" 2>/dev/null
    grep -E '^moss_(engine|vocoder|tts_vocoder)\{|^nv_inference_(count|queue_duration_us|compute_infer_duration_us)\{' "$W/metrics_$n.txt" \
      > "$R/metrics_$n.txt"
    stop_server
    layout_probe "$n" after
    cp "$W/server_$n.log" "$R/"
    # The GPU budget per frame at 256 running rows, from the counters just sampled.
    python3 -m perf.served_budget "$R/metrics_series_$n.txt" --out "$R/budget_$n.json" 2>&1 | tee -a "$R/scaling.log"
    [ -s "$trace" ] && python3 -m perf.trace_phases --trace "$trace" "$R"/bench_"$n"_*.json \
      --out "$R/trace_phases_$n.json" 2>&1 | tee -a "$R/scaling.log"
    log "layout $n: done after $((SECONDS - t0)) s"
  done
}

# The soak's processes: perf/soak.py and the client processes it spawned (their command lines do
# not name soak.py; soak.py writes their pids in its first line), the living ones: soak_pids NAME.
soak_pids() {
  local p
  for p in $(pgrep -f 'perf/soak\.py') $(sed -n 's/^soak: .* client processes (pids \([0-9 ]*\)).*/\1/p' "$R/$1.log" 2>/dev/null | head -1); do
    kill -0 "$p" 2>/dev/null && echo "$p"
  done
}

# The host every 5 s while the soak runs: memory, /dev/shm (the Python backend's shared memory) and
# the RSS of tritonserver, every stub and every soak process, so that a client process that dies or
# a host out of memory shows when it happened (the dmesg after the soak says whom the kernel killed).
sample_host() {
  local pids
  while :; do
    echo "t $(date +%s) $(date +%H:%M:%S)"
    free -m | grep '^Mem:'
    df -m /dev/shm | tail -1
    pids=$({ pgrep -f 'tritonserver|triton_python_backend_stub'; soak_pids "$1"; } | sort -un | paste -sd, -)
    [ -n "$pids" ] && ps -o pid,ppid,stat,rss,etime,cmd -p "$pids" | cut -c1-200
    sleep 5
  done > "$R/host_series_$1.txt" 2>&1
}

# Once, when no request has reached moss_tts for 15 s while the soak runs (the 2026-12-02 stall,
# seen again in round 18 on a slow-host machine: admissions stopped at once on all 8 client
# processes, one stream stayed inside moss_tts with its send or BLS call never returning, the
# heartbeat stopped 30 s later, and 15 s in no TCP connection to :8001 was established): where
# every soak process and every model's stub stand, into stall_NAME.txt, twice (at once and 45 s
# later, to tell a wedge from a pause):
# - the gRPC connections to tritonserver in every TCP state (and the listening socket's accept
#   queue), and whether its gRPC and HTTP frontends answer a health call;
# - the kernel wait channel of each tritonserver thread;
# - py-spy dumps (carry .whl): moss_tts's whole, with its native frames (where a send waits in the
#   stub), the others' first 200 lines (round 18's dump cut moss_tts at 80, before its streams);
# and, after the second snapshot, tritonserver's native thread backtraces (cuda-gdb, the device's
# only debugger; attaching pauses the server, so only here) into stall_gdb_NAME.txt.gz.
stall_snapshot() {
  local p
  echo "--- TCP connections with :8001 by state (server side sport, client side dport)"
  ss -tanH '( sport = :8001 or dport = :8001 )' 2>/dev/null | awk '{print $1}' | sort | uniq -c
  ss -ltnH '( sport = :8001 )' 2>/dev/null | sed 's/^/listening (Recv-Q = accept queue): /'
  echo "--- gRPC frontend: $(timeout 15 python3 -m client.healthcheck --url 127.0.0.1:8001 --timeout 5 2>&1 | tail -1)"
  echo "--- HTTP frontend: $(python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=5).status)" 2>&1 | tail -1)"
  for p in $(pgrep -x tritonserver); do
    echo "--- tritonserver $p threads (state, wait channel)"
    for t in /proc/"$p"/task/*; do echo "$(basename "$t") $(awk '{print $3}' "$t/stat") $(cat "$t/wchan" 2>/dev/null)"; done | sort -k2 | uniq -c -f1 | sort -rn | head -20
  done
  for p in $(pgrep -f "/moss_tts/1/model\.py"); do
    echo "--- py-spy dump --native $p: moss_tts"
    timeout 60 /tmp/pyspy/bin/py-spy dump --native --pid "$p" 2>&1 \
      || timeout 30 /tmp/pyspy/bin/py-spy dump --pid "$p" 2>&1
  done
  for p in $(soak_pids "$1") $(pgrep -f "/(vocoder|ref_encoder)/1/model\.py"); do
    echo "--- py-spy dump $p: $(tr '\0' ' ' < /proc/"$p"/cmdline 2>/dev/null | grep -o 'repo/[a-z_]*/1' | head -1)"
    timeout 20 /tmp/pyspy/bin/py-spy dump --pid "$p" 2>&1 | head -200
  done
}

watch_stall() {
  local last="" same=0 now p
  while :; do
    sleep 5
    now=$(python3 -c "import urllib.request; t = urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=2).read().decode(); print(sum(float(l.split()[-1]) for l in t.splitlines() if l.startswith('moss_engine{') and 'requests_admitted' in l))" 2>/dev/null)
    if [ -n "$now" ] && [ "$now" = "$last" ]; then same=$((same + 1)); else same=0; fi
    last=$now
    [ "$same" -ge 3 ] || continue
    [ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl 2>/dev/null
    { echo "=== $(date +%H:%M:%S): no request admitted for 15 s (admitted $now)"
      stall_snapshot "$1"
      sleep 45
      echo "=== $(date +%H:%M:%S): 45 s later (admitted $(python3 -c "import urllib.request; t = urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=2).read().decode(); print(sum(float(l.split()[-1]) for l in t.splitlines() if l.startswith('moss_engine{') and 'requests_admitted' in l))" 2>&1 | tail -1))"
      stall_snapshot "$1"
    } > "$R/stall_$1.txt" 2>&1
    for p in $(pgrep -x tritonserver); do
      timeout 150 cuda-gdb -p "$p" -batch -ex "set pagination off" -ex "thread apply all bt 16" 2>&1 | gzip > "$R/stall_gdb_$1.txt.gz"
    done
    return
  done
}

# Every 30 s while the soak runs: the server log into $R and $R into $OUT. A call cut by the
# device's hard limit runs no EXIT trap, and only what is already in $OUT comes back.
keep_results() {
  while :; do
    sleep 30
    cp "$W/server_$1.log" "$R/" 2>/dev/null
    tar -czf "$OUT/results.tgz.part" -C "$W" results 2>/dev/null && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
    cp "$R/scaling.log" "$OUT/" 2>/dev/null
  done
}

# The mixed soak of issue 19 on the real-size checkpoint, single layout: serve, soak SECONDS, then
# SIGTERM and time the shutdown (the soak itself checks every stream, row and session free and
# every heartbeat moving once its clients are gone).
soak() {
  env_pack
  prepare_repo
  # TAG: a name for this run's files (two servers in one call: an A/B of PARAMS).
  local t0=$SECONDS n="soak${TAG:+_$TAG}"
  clear_leftovers
  CUDA_VISIBLE_DEVICES=0 MODEL_REPOSITORY="$W/repo" PYTHON=python3 MOSS_TTS_MODEL_DIR="$W/ckpt/model" \
    MOSS_TTS_CODEC_DIR="$W/ckpt/codec" SHIM_PORT=0 MOSS_GPU_TRACE_DIR="${GPU_TRACE:+$W/gputrace_$n}" setsid $SERVER_PIN scripts/serve.sh > "$W/server_$n.log" 2>&1 < /dev/null &
  echo $! > "$W/server.pid"
  wait_ready http://127.0.0.1:8000/v2/health/ready || { log "$n: server died or not ready"; cp "$W/server_$n.log" "$R/"; stop_server; return 1; }
  log "$n: ready after $((SECONDS - t0)) s; ${CONCURRENCY:-256} streams for $1 s"
  # BENCH=1: first the layout's bench levels (REPEAT runs, LEVELS, MODE) against this same server,
  # so one call measures both within the device tool's 10 minutes (bench_soak_K.json).
  if [ -n "${BENCH:-}" ]; then
    sample_metrics "$n" & local sampler=$!
    bench_runs "$n" "${LEVELS:-1,128,256}" "${MODE:-stream,offline}"
    kill "$sampler" 2>/dev/null
  fi
  [ -n "${RECORD:-}" ] && record_stub "$n" &
  # The metric series, the host series and the results kept in $OUT, while the soak runs (and the
  # GPU traces: killed with the samplers, so none is asked for once the soak is over).
  sample_metrics "${n}_load" & SAMPLERS="$!"
  [ -n "${GPU_TRACE:-}" ] && { gpu_trace "$n" & SAMPLERS="$SAMPLERS $!"; }
  sample_host "$n" & SAMPLERS="$SAMPLERS $!"
  python3 perf/cpu_sample.py --interval 5 > "$R/cpu_series_$n.txt" 2>&1 & SAMPLERS="$SAMPLERS $!"
  keep_results "$n" & SAMPLERS="$SAMPLERS $!"
  watch_stall "$n" & SAMPLERS="$SAMPLERS $!"
  # RESPONSE_TIMEOUT: seconds a stream waits for its next response (120); every client process
  # writes a progress line to soak.log every 10 s, so a stall shows there before it times out.
  PYTHONUNBUFFERED=1 $CLIENT_PIN python3 -m perf.soak --url 127.0.0.1:8001 --metrics-url http://127.0.0.1:8002/metrics \
    --concurrency "${CONCURRENCY:-256}" --processes "${PROCESSES:-8}" --seconds "$1" --cancel-fraction 0.2 \
    --min-frames 40 --max-frames 112 --settle 60 --response-timeout "${RESPONSE_TIMEOUT:-120}" \
    --out "$R/$n.json" > "$R/$n.log" 2>&1
  local rc=$?
  local left
  log "$n: exit $rc after $((SECONDS - t0)) s"
  kill $SAMPLERS 2>/dev/null; SAMPLERS=""
  # Whatever the exit: what the kernel said (an OOM kill, a segfault) and any soak process left.
  left=$(soak_pids "$n" | sort -un | paste -sd, -)
  { echo "--- after the soak (exit $rc): dmesg, last 50 lines"
    dmesg 2>/dev/null | tail -50
    echo "--- soak processes left: ${left:-none}"
    [ -n "$left" ] && ps -o pid,ppid,stat,rss,etime,cmd -p "$left"
  } >> "$R/$n.log" 2>&1
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=5).read().decode())" \
    2>/dev/null | grep -E '^moss_' > "$R/metrics_$n.txt"
  local pid t1=$SECONDS kernel_lines; pid=$(cat "$W/server.pid")
  kernel_lines=$(dmesg 2>/dev/null | wc -l)
  kill -TERM "$pid"  # SHIM_PORT=0: serve.sh exec'd tritonserver itself
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t1)) -lt 60 ]; do sleep 0.2; done
  sleep 2
  log "$n: shutdown took $((SECONDS - t1)) s; stubs left: $(pgrep -fc triton_python_backend_stub)"
  cp "$W/server_$n.log" "$R/"
  # How the stubs ended: a crash at unload is in the server log (each stub's faulthandler: "Fatal
  # Python error") and, for one without it, in the kernel log after the SIGTERM.
  if dmesg > /dev/null 2>&1; then
    { dmesg | tail -n +$((kernel_lines + 1)) | grep -E "triton_python_b|tritonserver"
      grep -a "Fatal Python error" "$W/server_$n.log"; } > "$R/stub_crashes_$n.txt"
    log "$n: stub crashes at shutdown (server log + kernel log after SIGTERM): $(wc -l < "$R/stub_crashes_$n.txt")"
  else
    grep -a "Fatal Python error" "$W/server_$n.log" > "$R/stub_crashes_$n.txt"
    log "$n: stub crashes at shutdown (server log only: the kernel log cannot be read here): $(wc -l < "$R/stub_crashes_$n.txt")"
  fi
  grep -cE "successfully unloaded" "$W/server_$n.log" | xargs -I{} echo "models unloaded: {}" | tee -a "$R/scaling.log"
  grep -E "Non-graceful|Exit timeout|Traceback|invalid pointer|double free|Segmentation|stalled" "$W/server_$n.log" | head -20 \
    | tee -a "$R/scaling.log"
  python3 perf/cpu_sample.py --summary "$R/cpu_series_$n.txt" --skip 40 | sed 's/^/cpu (cores, from 40 s in): /' | tee -a "$R/scaling.log"
  # The soak's engine and vocoder rates by the cores the hypervisor stole (10 s windows): a
  # stolen window is not a figure of the code alone (issue 34, round 11).
  python3 -m perf.served_budget "$R/metrics_series_${n}_load.txt" --cpu "$R/cpu_series_$n.txt" 2>&1 | head -6 \
    | tee -a "$R/scaling.log"
  python3 -c "import json; r = json.load(open('$R/$n.json')); print({k: r.get(k) for k in ('ok', 'requests', 'outcomes', 'num_failures', 'first_audio_ms_p50', 'first_audio_ms_p95', 'audio_seconds', 'wall_seconds', 'end_problems')})" \
    | tee -a "$R/scaling.log"
  stop_server
}

# The OpenAI shim beside the gRPC bench (issue 31): serve on one GPU with the shim on 8080
# (SHIM_WORKERS: serve.sh's default, one per usable core, at most 8), then perf/shim_load.py REPEAT
# times against that one server: the gRPC bench's stream (bench_triton.one_stream, FRAMES frames)
# and the same utterance as the shim's streamed pcm, then text sessions fed at 20 words/s straight
# over gRPC and over the shim's WebSocket, at SHIM_LEVELS (1,64,128); shim_K.json each, with the
# shim's CPU seconds (the parent and its workers, from /proc). RECORD as for the soak (carry .whl).
# The server traces every request's first audio (TRACE=0: not) and perf/trace_phases.py cuts the
# trace by level: trace_phases.json, where each level's first audio went inside moss_tts.
shim() {
  env_pack
  prepare_repo
  local t0=$SECONDS n=shim pid ready=0 trace=""
  [ "${TRACE:-1}" = 1 ] && trace="$R/first_audio_trace.jsonl"
  CUDA_VISIBLE_DEVICES=0 MODEL_REPOSITORY="$W/repo" PYTHON=python3 MOSS_TTS_MODEL_DIR="$W/ckpt/model" \
    MOSS_TTS_FIRST_AUDIO_TRACE="$trace" \
    MOSS_TTS_CODEC_DIR="$W/ckpt/codec" SHIM_PORT=8080 VOICES_DIR="$W/voices" setsid scripts/serve.sh \
    > "$W/server_$n.log" 2>&1 < /dev/null &
  echo $! > "$W/server.pid"
  wait_ready http://127.0.0.1:8000/v2/health/ready http://127.0.0.1:8080/health && ready=1
  cp "$W/server_$n.log" "$R/"
  if [ $ready = 0 ]; then log "$n: server or shim not ready"; tail -40 "$W/server_$n.log"; stop_server; return 1; fi
  pid=$(pgrep -of "client.openai_shim")
  log "$n: ready after $((SECONDS - t0)) s; shim pid $pid, workers: $(pgrep -c -P "$pid")"
  sample_metrics "$n" & local sampler=$!
  [ -n "${RECORD:-}" ] && record_stub "$n" &
  for k in $(seq "${REPEAT:-1}"); do
    log "$n: run $k"
    PYTHONUNBUFFERED=1 python3 -m perf.shim_load --shim-url http://127.0.0.1:8080 --grpc-url 127.0.0.1:8001 \
      --transports "${SHIM_TRANSPORTS:-grpc,http,grpc_session,ws}" --concurrency "${SHIM_LEVELS:-1,64,128}" \
      --frames "${FRAMES:-112}" --requests "${REQUESTS:-2}" --processes "${PROCESSES:-8}" --shim-pid "$pid" \
      --timeout 120 --out "$R/shim_$k.json" 2>&1 | tee -a "$R/scaling.log"
    cp "$R/shim_$k.json" "$OUT/" 2>/dev/null
  done
  kill "$sampler" 2>/dev/null
  kill -TERM "$(cat "$W/server.pid")" 2>/dev/null  # serve.sh passes it to tritonserver and the shim
  for _ in $(seq 60); do pgrep -f "client.openai_shim|tritonserver" > /dev/null || break; sleep 0.5; done
  log "$n: stopped after $((SECONDS - t0)) s; left: $(pgrep -fc 'client.openai_shim|tritonserver|triton_python_backend_stub')"
  cp "$W/server_$n.log" "$R/"
  pkill -9 -f client.openai_shim; stop_server
  if [ -n "$trace" ] && [ -s "$trace" ]; then
    python3 -m perf.trace_phases --trace "$trace" "$R"/shim_*.json --out "$R/trace_phases.json" 2>&1 | tee -a "$R/scaling.log"
    cp "$R/trace_phases.json" "$OUT/" 2>/dev/null
  fi
}

# AB="a:k=v,...;b:k=v,...": the single layout once per variant, with that variant's PARAMS and
# its files tagged with its name (bench_single_a_K.json, metrics_series_single_a.txt, budget_...).
ab() {
  local variant
  IFS=';' read -ra variants <<< "${AB:?AB=\"name:k=v,...;name:k=v,...\"}"
  for variant in "${variants[@]}"; do
    TAG=${variant%%:*} PARAMS=${variant#*:} layout single
  done
}

# AB="a:k=v,...;b:k=v,..." AB_UNTIL=EPOCH_S ... ab_soak SECONDS: the soak (BENCH, LEVELS, MODE and
# REPEAT as for soak) once per variant, each on a server of its own with that variant's PARAMS and its
# files tagged with its name. Each arm gets an equal share of the time left until AB_UNTIL (epoch
# seconds: the device call's own deadline); an arm cut short leaves its server to the next arm's
# clear_leftovers. Then each arm's figures (ab_summary.txt).
ab_soak() {
  local variant left share
  IFS=';' read -ra variants <<< "${AB:?AB=\"name:k=v,...;name:k=v,...\"}"
  left=${#variants[@]}
  for variant in "${variants[@]}"; do
    share=$(( (${AB_UNTIL:?AB_UNTIL: epoch seconds by which every arm ends} - $(date +%s)) / left ))
    [ "$share" -gt 30 ] || { log "ab_soak: ${variant%%:*} skipped (${share} s left for it)"; left=$((left - 1)); continue; }
    TAG=${variant%%:*} PARAMS=${variant#*:} timeout "$share" bash perf/h200_scaling.sh soak "$1" 2>&1 | tail -2
    log "ab_soak: ${variant%%:*} ended"
    left=$((left - 1))
  done
  clear_leftovers
  for variant in "${variants[@]}"; do ab_figures "soak_${variant%%:*}"; done | tee "$R/ab_summary.txt"
}

# One soak run's figures: each bench level (concurrency, audio-s/s, first audio p95, RTF p95, streams
# with an underrun, underruns by chunk, stolen cores), the soak, and its steal-free budget.
ab_figures() {
  local k
  for k in $(seq "${REPEAT:-1}"); do
    [ -e "$R/bench_$1_$k.json" ] && python3 -c "import json; [print('$1', $k, l['concurrency'], round(l['audio_s_per_s'], 1), \
l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), l['streams_with_underruns'], l.get('underruns_by_chunk'), l['host_steal_cores']) \
for l in json.load(open('$R/bench_$1_$k.json'))]"
  done
  [ -e "$R/$1.json" ] && python3 -c "import json; d = json.load(open('$R/$1.json')); print('$1 soak', d['requests'], \
d['num_failures'], round(d['audio_seconds'] / d['wall_seconds'], 1), d['first_audio_ms_p50'], d['first_audio_ms_p95'])"
  [ -e "$R/metrics_series_$1_load.txt" ] && python3 -m perf.served_budget "$R/metrics_series_$1_load.txt" \
    --cpu "$R/cpu_series_$1.txt" 2>/dev/null | tail -2
  grep -h "$1: shutdown took\|$1: stub crashes" "$R/scaling.log" | tail -2 || true  # none when cut short
}

# An A/B of two trees on one machine (after one setup): the single layout served from this tree
# (TAG new) and from the tree in $1 (TAG old: its own script, env.sh and model repository, so its
# own moss_tts: the pack's env.sh puts the tree it is sourced in first on every python3's path),
# alternating ROUNDS times (1). Each layout takes ~2.5 min at REPEAT=1: one round fits a call.
# Rounds alternate which tree goes first (new, old, then old, new, ...: ABBA at ROUNDS=2), and
# FIRST=old starts with the other tree: round 24's three pairs all ran new first on a host whose
# probe moved 29-68 ms between calls, so the order could not be told from the trees.
trees() {
  local other=${1:?"trees DIR: the other tree (e.g. git archive OLD | tar -x -C DIR)"} k first=${FIRST:-new}
  [ -f "$other/perf/h200_scaling.sh" ] || { log "trees: $other/perf/h200_scaling.sh missing"; return 1; }
  case $first in new|old) ;; *) log "trees: FIRST must be new or old, got '$first'"; return 1 ;; esac
  for k in $(seq "${ROUNDS:-1}"); do
    if [ "$first" = new ]; then tree_new "$k"; tree_old "$other" "$k"; first=old
    else tree_old "$other" "$k"; tree_new "$k"; first=new; fi
  done
}
tree_new() { TAG="new$1" layout single; }
tree_old() {
  # this tree's layout probes its host itself; an older tree's may not (layout_probe came in round 23)
  layout_probe "single_old$2" before
  (cd "$1" && TAG="old$2" bash perf/h200_scaling.sh layout single)
}

all() {
  setup && vocoder
  layout single replicas_2gpu split_2gpu
}

"$@"
