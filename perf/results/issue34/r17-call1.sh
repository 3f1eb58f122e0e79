#!/usr/bin/env bash
# Round 17, call 1 (one machine, carry .device; ~9.5 min). Rounds 15 and 16's served-off knobs against
# the served config in one call (r16-call1.sh's three arms plus r15-call2.sh's dl40; a 30 s soak each
# so that four arms fit): fw0 (served), fw1 (vocoder_forward_chunks=true), hd0 (host_turn_deliver_us=0,
# the delivery before round 16), dl40 (chunk_deadline_ms=40). Each arm on a server of its own: the
# stream level 256 twice, then a 30 s mixed soak. The c=256 targets: >= 1,100 audio-s/s,
# <= 1% of streams with an underrun (underruns_by_chunk says which chunk ran dry).
set -uo pipefail
source perf/device_call.sh r17c1
call_setup &
SETUP=$!
echo "stream host bench: $(PYTHONPATH=python_backends:. python3 perf/bench_stream_host.py 2>&1 | tr -d '\n' | cut -c1-600)" \
  | tee -a $R/host_bench.txt
wait $SETUP
AB="fw0:;fw1:vocoder_forward_chunks=true;hd0:host_turn_deliver_us=0;dl40:chunk_deadline_ms=40" AB_UNTIL=$(call_until 575) \
  BENCH=1 LEVELS=256 MODE=stream REPEAT=2 RESPONSE_TIMEOUT=30 bash perf/h200_scaling.sh ab_soak 30
call_mark "arms done"
