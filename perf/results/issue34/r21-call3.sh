#!/usr/bin/env bash
# Round 21, call 3 (carry .device; ~5 min; any host). Call 2 (H100, r21-call2.sh) swept the fused kernel's tiles
# at 2-64 tokens: at <= 16 tokens the best tiles match or beat the served chain (LayerNorm + cuBLAS)
# per GEMM (d 768: in_proj 6.2-7.0 against 7.5 us, the residual GEMMs 6.8 against 7.9 with
# split-K), at 32-64 they lose badly (norm GEMMs 12-22 against 8-11 us), so small_gemm_rows 64
# lost (1 x 2: 4.68-4.75 ms against 4.03-4.18). Here: the same swept table (carried as
# r21-h100-codec-gemm-sweep-call2.json) at small_gemm_rows 16 and 8, against 0, alternating.
set -uo pipefail
source perf/device_call.sh r21c3
TABLE=perf/results/issue34/r21-h100-codec-gemm-sweep-call2.json
swept() { call_small_gemm_vocoder "$1" "swept_$2" --gemm-table "$TABLE"; }
swept 16 a; swept 0 a; swept 16 b; swept 0 b
if [ "$(call_left 585)" -gt 60 ]; then swept 8 a; fi
cp $R/vocoder_sg*.json $OUT/ 2>/dev/null
call_mark "done"
