#!/usr/bin/env bash
# Round 23, call 3 (ran on an H100, 287 s; the knob measured no faster at 256 slots and was removed
# after it: this script needs ace2cf8's tree; perf/RESULTS.md, round 23). Carry .device; <= 330 s.
# DecodeConfig.kv_per_program (built this round, served off): several KV heads a decode-attention
# program, so a program's 16 tl.dot rows are real query heads and a tile reads 1 KB of each cache
# row, not 256 bytes (the kernel is at ~2.6-2.8 TB/s of an H100's ~3.35, ~3.7 of an H200's ~4.8).
# 1. its GPU tests (bf16 at the backbone's shape, 2/4/8 heads a program);
# 2. bench_decode_attention at 256 and 128 slots: 1, 2, 4 KV heads a program, tiles of 8-64 rows;
# 3. the engine step at 256, served (1 head) against the sweep's best at 256 slots with more heads,
#    alternating (one process each) while time is left.
set -uo pipefail
source perf/device_call.sh r23c3
END=${END:-330}
call_gpu_tests decode_attention
PYTHONPATH=python_backends:. PYTHONUNBUFFERED=1 timeout 150 python3 perf/bench_decode_attention.py --batches 256,128 \
  --blocks 8,16,32,64 --warps 4,8 --stages 2,3 --splits 0 --orders heads --kv-per-program 1,2,4 \
  --out $R/decode_attention.json > $R/decode_attention.log 2>&1
grep -E "^best|default|Error" $R/decode_attention.log | head -12
cp $R/decode_attention.json $OUT/ 2>/dev/null
call_mark "sweep done"
BEST=$(python3 -c "
import json
runs = [r for r in json.load(open('$R/decode_attention.json'))['runs']
        if r['batch'] == 256 and r['mix'] == 'served' and r['kv_per_program'] > 1]
b = min(runs, key=lambda r: r['us_per_call'])
print(b['kv_per_program'], b['block_n'])" 2>/dev/null)
set -- $BEST
if [ -z "${2:-}" ]; then echo "no kv_per_program > 1 result"; exit 0; fi
echo "engine A/B: kv 1 against kv $1 block $2"
call_engine_step heads kv1a $END
call_engine_step heads kv$1b$2a $END --decode-kv $1 --decode-block $2
if [ "$(call_left $END)" -gt 70 ]; then call_engine_step heads kv1b $END; fi
if [ "$(call_left $END)" -gt 40 ]; then call_engine_step heads kv$1b$2b $END --decode-kv $1 --decode-block $2; fi
call_mark "done"
