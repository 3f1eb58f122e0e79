#!/usr/bin/env bash
# Round 15, call 2 (one machine, carry .device; ~9 min). Chunk deadlines (EngineConfig.chunk_deadline_ms,
# engine/chunk_deadlines.py, served 0 = off), built in round 15 on the CPU: on a fake clock they remove
# the second chunk's gap of a wave's slow start; on the 2-core dev box's tiny server (slow steps
# throughout) they moved the gaps from chunks 1-3 to 4-6 (perf/RESULTS.md, round 15). Here, on the
# H200's served config (look at underruns_by_chunk: gaps at chunk 4+ point at MAX_EARLY_CHUNKS):
# - beside the setup, the engine thread's host work on this host's CPU (bench_engine_host.py: a
#   256-prompt admission wave, and a step's frames at 256 rows with deadlines off and on);
# - the A/B, one server each: dl0 (served), dl40, dl80 (chunk_deadline_ms): the stream level 256 twice,
#   then a 40 s mixed soak. The c=256 target: <= 1% of streams with an underrun.
set -uo pipefail
source perf/device_call.sh r15c2
call_setup &
SETUP=$!
for args in "--admit 256" "--rows 256 --steps 300" "--rows 256 --steps 300 --chunk-deadline-ms 40"; do
  echo "host bench $args: $(PYTHONPATH=python_backends:. python3 perf/bench_engine_host.py $args)" | tee -a $R/host_bench.txt
done
wait $SETUP
AB="dl0:;dl40:chunk_deadline_ms=40;dl80:chunk_deadline_ms=80" AB_UNTIL=$(call_until 560) BENCH=1 LEVELS=256 MODE=stream \
  REPEAT=2 RESPONSE_TIMEOUT=30 bash perf/h200_scaling.sh ab_soak 40
call_mark "arms done"
grep -h '"python_ms"' $W/results/scaling.log | tail -1
