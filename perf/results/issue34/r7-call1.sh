#!/usr/bin/env bash
# Round 7, call 1: A/B of main (aad2f62: /tmp/main) against this tree (round7: grouped RoPE, per-source
# walk for short chunks, no zero fill, eighth frame buckets from 512, the draw's top-k path) on ONE
# machine; each tree's env.sh sourced inside that tree (its .pth puts the sourcing tree first).
set -uo pipefail
R=/tmp/r7res; mkdir -p $R /tmp/main
trap 'tar -czf $OUT/results.tgz -C /tmp r7res' EXIT
tar -xJf .device/triton-pack.tar.xz -C /opt && tar -xJf .device/ab/main.tar.xz -C /tmp/main
cp perf/results/issue34/r6-attention-ab.py /tmp/attn_ab.py
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
T0=$(date +%s)
in_tree() { local d=$PWD; [ $1 = main ] && d=/tmp/main; shift; (cd $d && source /opt/moss-pack/env.sh >/dev/null 2>&1 && PYTHONPATH=$d:$d/python_backends PYTHONUNBUFFERED=1 "$@"); }
for v in main new; do
  in_tree $v timeout 170 python3 perf/bench_vocoder.py --shapes 1x2,256x10 --rounds 128,256 --iters 10 \
     --skip offline,streaming,equivalence --profile-round 256 --out $R/stage-$v.json > $R/stage-$v.log 2>&1
  grep -E "moss_tts|^ +[0-9]+ x|round|_attention_kernel|_rope_kernel|_ring_write|FillF|Self CUDA|captured" $R/stage-$v.log | cut -c1-180
  echo "== bench_vocoder $v done at $(( $(date +%s) - T0 )) s"
done
for v in main new; do
  in_tree $v timeout 150 python3 perf/bench_engine.py --batches 256 --skip equivalence,offline,latency,probe,naive,prefix,fp32,profile \
     --out $R/engine-$v > $R/engine-$v.log 2>&1
  grep -E "moss_tts|step|256" $R/engine-$v.log | head -12 | cut -c1-180
  echo "== bench_engine $v done at $(( $(date +%s) - T0 )) s"
done
(source /opt/moss-pack/env.sh >/dev/null 2>&1 && PYTHONPATH=python_backends:tests:. timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider \
   tests/test_sample_kernel.py tests/test_window_attention.py tests/test_codec.py tests/test_vocoder_graphs.py 2>&1 | tail -15 | tee $R/gpu-tests.txt)
echo "== tests done at $(( $(date +%s) - T0 )) s"
for v in new main; do
  [ $(( $(date +%s) - T0 )) -lt 470 ] || break
  in_tree $v timeout 60 python3 /tmp/attn_ab.py $R/attn-$v.json 2>&1 | grep -v Warning
done
echo "== all done at $(( $(date +%s) - T0 )) s"
