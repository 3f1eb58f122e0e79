#!/usr/bin/env bash
# The common start of a device call script (a call = one `run` on a lent GPU machine, carry .device):
#   source perf/device_call.sh NAME
# sets T0 (the call's start: every second of it counts against its 600), W=/tmp/moss-scale and
# R=$W/results/NAME, traps the call's exit to tar $W/results into $OUT/results.tgz, unpacks the
# device pack (.device/triton-pack.tar.xz: tritonserver 2.51 and the stub) and sources its env.sh,
# and names the GPU. Then:
#   call_setup        perf/h200_scaling.sh setup (the real-size random checkpoint, ~31 s) into
#                     $R/setup.log; prints its last line and the call's seconds so far
#   call_until S      epoch seconds at S seconds into the call (AB_UNTIL, timeouts)
#   call_left S       seconds left until S seconds into the call
#   call_mark WHAT    "WHAT at N s"
#   call_gpu_tests T...  tests/test_T.py -m gpu, each file in a process of its own and all at once
#                     (a device-side assert poisons every later test of its process: round 14), into
#                     $R/gpu_tests_T.txt; waits for them and prints each file's last line
#   call_levels       a line per level of each bench_single_*.json (file, mode, concurrency, audio-s/s,
#                     first audio p50 / p95, RTF p95, streams with an underrun, failures, host busy /
#                     stolen cores)
#   call_host_probe   call_setup, whose perf/host_probe.py writes $W/results/host_probe.json;
#                     sets PROBE_MS, one core's Python probe in ms (~30 fast hosts, ~70 slow ones)
#   call_served_codec_gpu_tests  test_codec.py's GPU tests of the codec's serving form (the
#                     quantizer table included) into $R/gpu_tests_codec_served.txt; prints its last line
#   call_small_gemm_vocoder ROWS LABEL [FLAGS...]  one perf/bench_vocoder.py run of the small-GEMM
#                     A/B (1x2, 4x2, 16x10 steps; rounds of 16 and 128 rows) at small_gemm_rows ROWS,
#                     into $R/vocoder_sgROWS_LABEL.{json,log}, within the call's 585 s; prints its lines
#   call_engine_step ORDER LABEL END [FLAGS...]  one perf/bench_engine.py run of the decode step at batch
#                     256 with the decode attention's grid ORDER (slots / heads: --decode-order; one
#                     process per order) and FLAGS (e.g. --decode-kv 4 --decode-block 16), ending by END
#                     s into the call, into $R/engine_ORDER_LABEL{,.log} and $OUT/engine_ORDER_LABEL.json;
#                     prints its line
#   call_ab END [VAR=VALUE...]  perf/h200_scaling.sh ab (AB, LEVELS, MODE ... as VARs; one run a level,
#                     30 s response timeout unless given) ending by END s into the call, into
#                     $R/ab.log; prints call_levels' lines and copies the bench JSONs to $OUT
T0=$SECONDS
W=/tmp/moss-scale
R=$W/results/${1:?source perf/device_call.sh NAME}
mkdir -p "$R"
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader

call_mark() { echo "$1 at $((SECONDS - T0)) s"; }
call_left() { echo $(( $1 - SECONDS + T0 )); }
call_until() { echo $(( $(date +%s) + $1 - SECONDS + T0 )); }
call_setup() {
  bash perf/h200_scaling.sh setup > "$R/setup.log" 2>&1
  tail -1 "$R/setup.log"
  call_mark "setup done"
}
call_gpu_tests() {
  local t pids=()
  for t in "$@"; do
    PYTHONPATH=python_backends:tests:. timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
      "tests/test_$t.py" > "$R/gpu_tests_$t.txt" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  for t in "$@"; do echo "gpu tests $t: $(tail -1 "$R/gpu_tests_$t.txt")"; done
}
call_levels() {
  local f
  for f in $W/results/bench_single_*.json; do python3 -c "import json,sys; [print(sys.argv[1].split('/')[-1], l['mode'], \
l['concurrency'], round(l['audio_s_per_s'], 1), l['ttfa_ms'].get('p50'), l['ttfa_ms'].get('p95'), l['rtf'].get('p95'), \
l['streams_with_underruns'], l['failures'], l.get('host_busy_cores'), l.get('host_steal_cores')) \
for l in json.load(open(sys.argv[1]))]" $f; done
}
call_ab() {
  local end=$1
  shift
  env REPEAT=1 RESPONSE_TIMEOUT=30 "$@" timeout "$(call_left "$end")" bash perf/h200_scaling.sh ab > "$R/ab.log" 2>&1
  call_levels
  cp $W/results/bench_single_*.json "$OUT/" 2>/dev/null
}
call_host_probe() {
  # After setup, not beside it: round 20's probe ran beside the checkpoint's generation and read
  # 65 ms on a host whose own setup probe read 34 (a fast host taken for a slow one)
  call_setup
  PROBE_MS=$(python3 -c "import json; print(int(json.load(open('$W/results/host_probe.json'))['python_ms']))")
  echo "host probe: $PROBE_MS ms"
}
call_served_codec_gpu_tests() {
  PYTHONPATH=python_backends:tests:. timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_codec.py \
    -k "quantizer or serving_form" > "$R/gpu_tests_codec_served.txt" 2>&1
  echo "gpu tests codec (quantizer table, serving form): $(tail -1 "$R/gpu_tests_codec_served.txt")"
}
call_small_gemm_vocoder() {
  local rows=$1 label=$2
  shift 2
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left 585)" python3 perf/bench_vocoder.py \
    --shapes 1x2,4x2,16x10 --rounds 16,128 --iters 20 --skip offline,streaming --small-gemm-rows "$rows" "$@" \
    --out "$R/vocoder_sg${rows}_$label.json" > "$R/vocoder_sg${rows}_$label.log" 2>&1
  echo "small_gemm_rows $rows ($label):"
  grep -E "^ +[0-9]+ x|round of|equivalence|ERROR|Error" "$R/vocoder_sg${rows}_$label.log" | cut -c1-200
  call_mark "vocoder $rows $label done"
}
call_engine_step() {
  local order=$1 label=$2 end=$3
  shift 3
  PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout "$(call_left "$end")" python3 perf/bench_engine.py --batches 256 \
    --skip equivalence,offline,latency,probe,naive,prefix,fp32,split,profile --decode-order "$order" "$@" \
    --out "$R/engine_${order}_$label" > "$R/engine_${order}_$label.log" 2>&1
  echo "engine $order $label: $(grep -E "decode step|ERROR" "$R/engine_${order}_$label.log" | head -2 | cut -c1-160)"
  cp "$R/engine_${order}_$label/bench.json" "$OUT/engine_${order}_$label.json" 2>/dev/null
  call_mark "engine $order $label"
}
