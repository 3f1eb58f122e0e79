#!/usr/bin/env bash
# Round 16, call 1 (one machine, carry .device; ~9 min). Two stub changes of round 16 that move where
# the GIL's work happens at a 256-stream wave, built and measured on the CPU only:
# - vocoder_forward_chunks (pipeline/chunk_forwarder.py, served false): the engine's delivery hands a
#   plain stream's chunks to the in-process vocoder, so its stream thread wakes only to send. In
#   perf/bench_wave.py's CPU model (final code, three runs each): first audio p50 147-189 -> 115-153 ms;
# - host_turn_deliver_us (served 1000): the delivery under a widened GIL switch interval (4-9x shorter
#   deliveries in the CPU models); hd0 puts it back to 0, the behaviour before.
# The A/B, one server each (h200_scaling.sh ab_soak: the stream level 256 twice, then a 40 s mixed soak):
# fw0 (served), fw1 (vocoder_forward_chunks=true), hd0 (host_turn_deliver_us=0). The c=256
# targets: >= 1,100 audio-s/s, <= 1% of streams with an underrun; look at underruns_by_chunk and the
# engine's step_launch_ms / step_apply_ms over the level (the metrics series).
set -uo pipefail
source perf/device_call.sh r16c1
call_setup &
SETUP=$!
echo "stream host bench: $(PYTHONPATH=python_backends:. python3 perf/bench_stream_host.py 2>&1 | tr -d '\n' | cut -c1-600)" \
  | tee -a $R/host_bench.txt
wait $SETUP
AB="fw0:;fw1:vocoder_forward_chunks=true;hd0:host_turn_deliver_us=0" AB_UNTIL=$(call_until 560) BENCH=1 LEVELS=256 \
  MODE=stream REPEAT=2 RESPONSE_TIMEOUT=30 bash perf/h200_scaling.sh ab_soak 40
call_mark "arms done"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
