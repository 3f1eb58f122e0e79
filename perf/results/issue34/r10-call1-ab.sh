#!/usr/bin/env bash
# Round 10 (prepared in round 9 on branch round9-prep), call 1 (one machine): the first-audio hold's
# effect under load, which round 9 could not measure (its hold-off server ran 256 streams right
# after loading). Two servers of this tree, one after the other, each with the same warm-up (the
# levels in order 1, 128, 256, twice) and 20 single-stream requests: TAG off (first_audio_hold_rows=0:
# no gate wired, the pre-hold behaviour) and TAG on (4, the served default; round9-prep also stops
# the vocoder from recording an event per START round while the engine cannot hold).
set -uo pipefail
W=/tmp/moss-scale; R=$W/results/c1; mkdir -p $R
trap 'tar -czf $OUT/results.tgz -C $W results' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$SECONDS
bash perf/h200_scaling.sh setup > $R/setup.log 2>&1; tail -1 $R/setup.log; echo "setup $((SECONDS-T0)) s"
AB="off:first_audio_hold_rows=0;on:first_audio_hold_rows=4" C1_REQUESTS=20 REPEAT=2 LEVELS=1,128,256 MODE=stream \
  RESPONSE_TIMEOUT=30 timeout $((570 - SECONDS + T0)) bash perf/h200_scaling.sh ab
echo "ab $((SECONDS-T0)) s"
for t in off on; do python3 perf/served_budget.py $W/results/metrics_series_single_$t.txt | tail -1; done
