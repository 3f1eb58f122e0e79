#!/usr/bin/env bash
# Round 18, call 3 (warm after call 2, or fresh; carry .device with .device/ab/pre = main 3e28f89's
# python_backends and perf, the code before the fused ring kernel; ~5 min). The fused streaming
# attention (kernels/fused_window_attention.py: RoPE, attention and ring write in one launch)
# against the split kernels, and the split kernels' refactor (shared jit helpers) against the
# code before it:
# - GPU tests: fused == split bit for bit at the codec's stage shapes, the window-attention and
#   codec GPU tests;
# - bench_vocoder, one process each: the code before (split), this tree split (with the
#   attention sweep: both kernels per stage and a packed round), this tree fused.
set -uo pipefail
source perf/device_call.sh r18c3
call_setup &
SETUP=$!
call_gpu_tests fused_window_attention window_attention codec
wait $SETUP
BENCH="--shapes 1x2,256x10 --rounds 128,256 --iters 10 --skip offline,streaming"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout $(call_left 200) python3 perf/bench_vocoder.py $BENCH --ring-kernel split \
  --attention-sweep --out $R/vocoder_split.json > $R/vocoder_split.log 2>&1
call_mark "split done"
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout $(call_left 275) python3 perf/bench_vocoder.py $BENCH --ring-kernel fused \
  --out $R/vocoder_fused.json > $R/vocoder_fused.log 2>&1
call_mark "fused done"
for k in split fused; do echo "== $k"; grep -E "^ +[0-9]+ x|round of|equival|fused|ring" $R/vocoder_$k.log | cut -c1-220 | head -14; done
cp $R/vocoder_*.json $OUT/ 2>/dev/null
