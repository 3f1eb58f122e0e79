#!/usr/bin/env bash
# Round 20, call 1 (a fresh H200, carry .device; .whl where it fits; ~9.5 min). r19-call1.sh's choice by the
# host probe, with this round's code (the served quantizer table):
# - a fast host (probe <= 45 ms): the 330 s mixed soak (the second soak run), stall
#   snapshots armed as in round 19;
# - a slow host (no throughput target can show there): the small-GEMM path's GPU tests and its
#   A/B instead (r20-call2.sh's core: small_gemm_rows 0 / 64, alternating), host-independent.
set -uo pipefail
source perf/device_call.sh r20c1
call_host_probe
if [ "$PROBE_MS" -le 45 ]; then
  echo "fast host ($PROBE_MS ms): the 330 s soak"
  # py-spy's GIL record of the soak's start only where its wheel was carried (.whl): the tree and
  # the device pack alone are ~64 MiB, the carry limit
  RECORD=$(ls .whl/py_spy-*.whl >/dev/null 2>&1 && echo 0:4:gil) RESPONSE_TIMEOUT=30 \
    timeout $(call_left 585) bash perf/h200_scaling.sh soak 330 2>&1 | tail -12
  cp $W/results/soak.json $OUT/ 2>/dev/null
  grep -h "work stalled\|moves again" $W/server_soak.log $W/results/server_soak.log 2>/dev/null | head -5
else
  echo "slow host ($PROBE_MS ms): the small-GEMM path instead"
  call_gpu_tests fused_linear small_gemm
  call_served_codec_gpu_tests
  for run in 0:a 64:a 0:b 64:b; do
    [ "$(call_left 585)" -gt 140 ] || break
    call_small_gemm_vocoder ${run%%:*} ${run##*:}
  done
  cp $R/vocoder_sg*.json $OUT/ 2>/dev/null
fi
call_mark "done"
