#!/usr/bin/env bash
# Round 9, call 5 (machine D, warm after call 4): the 330 s mixed soak on the final code (run inline
# as the call's command; recorded here).
set -o pipefail
tar -xJf .device/triton-pack.tar.xz -C /opt && source /opt/moss-pack/env.sh && RESPONSE_TIMEOUT=30 timeout 560 \
  bash perf/h200_scaling.sh soak 330 2>&1 | tail -45
tar -czf $OUT/results.tgz -C /tmp/moss-scale results
