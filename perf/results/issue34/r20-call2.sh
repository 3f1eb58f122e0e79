#!/usr/bin/env bash
# Round 20, call 2 (prepared in round 20, not yet run; carry .device; ~9 min; any host: every figure
# here is GPU time). The codec's small-GEMM path (d763020, served off): do steps of a few tokens a
# stage get cheaper when each layer's four GEMMs run as kernels/fused_linear.py's, with the
# LayerNorms, the GELU and the residual adds inside (~7 graph nodes a layer instead of ~10)?
# Since 46f2331 the served quantizer decodes from one table (3 kernels a step instead of ~50), in
# every run here. Round 8's 1 x 2 profile: 3.29 ms of kernels in a 3.72 ms step, GEMMs 2.16 ms of it (368 cuBLAS
# GEMMs at ~5 us and 92 split-K reduces), LayerNorms 0.41 ms (184 x 2.2 us). Target: 1 x 2 <= 3.5 ms.
# 1. GPU tests of the kernel and the path (bf16 and fp32 against cuBLAS / the served form);
# 2. bench_codec_gemm at 2-64 tokens: the served chain against the fused kernel in nn.Linear's
#    layout (fused_k), per GEMM of a layer, both codec stage shapes;
# 3. bench_vocoder, one process per setting, alternating: small_gemm_rows 0 (served), 64 (every
#    stage of a 1 x 2 step), 16 (the first stages only): 1 x 2, 4 x 2, 16 x 10 steps, rounds of 16
#    and 128 rows. Then, if time is left, 0 and 64 again (the spread).
set -uo pipefail
source perf/device_call.sh r20c2
call_gpu_tests fused_linear small_gemm
call_served_codec_gpu_tests
call_mark "gpu tests done"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 200 python3 perf/bench_codec_gemm.py --rows 2,4,8,16,32,64 \
  --reps 20 --iters 10 --out $R/codec_gemm_few_rows.json > $R/codec_gemm.log 2>&1
grep -vE "^\s*$" $R/codec_gemm.log | head -52 | cut -c1-150
call_mark "codec gemm done"
call_small_gemm_vocoder 0 a; call_small_gemm_vocoder 64 a --profile 1x2  # the profile: one eager 1 x 2 step's kernels
call_small_gemm_vocoder 16 a
if [ "$(call_left 585)" -gt 150 ]; then call_small_gemm_vocoder 64 b; fi
if [ "$(call_left 585)" -gt 150 ]; then call_small_gemm_vocoder 0 b; fi
cp $R/codec_gemm_few_rows.json $R/vocoder_sg*.json $OUT/ 2>/dev/null
