"""window_attention (RoPE + attention + ring write) per codec decoder stage at 256 rows, with the
tiles the imported moss_tts's attention_config picks: ms per call from graph replays (as
bench_vocoder.py --attention-sweep, default config only). Run once per tree, on one machine."""
import json, sys
import torch
import moss_tts.kernels.window_attention as wa
from perf.graph_timing import graph_ms

print("module", wa.__file__, flush=True)
device = torch.device("cuda")
STAGES = ((20, 125, 10, 256, True), (12, 250, 20, 256, True), (12, 400, 40, 256, True), (12, 400, 80, 256, True),
          (12, 400, 160, 256, True), (12, 400, 320, 256, True), (12, 400, 3200, 32, False))
torch.manual_seed(0)
out = []
for heads, window, t, n, streaming in STAGES:
    qkv = torch.randn(n, t, 3 * heads * 64, device=device, dtype=torch.bfloat16)
    offsets = torch.randint(0, 10 * window, (n,), device=device)
    rope = wa.rope_table((offsets if streaming else torch.zeros(1, device=device, dtype=torch.long))[:, None]
                         + torch.arange(t, device=device), 64, 1e4)
    ring = (wa.Ring(*(torch.randn(n + 1, heads, window, 64, device=device, dtype=torch.bfloat16) for _ in range(2)),
                    torch.randperm(n, device=device), offsets) if streaming else None)
    ms = [graph_ms(lambda _: wa.window_attention(qkv, rope, heads, window, ring), 10, 10) for _ in range(3)]
    out.append({"heads": heads, "window": window, "tokens": t, "rows": n, "config": str(wa.attention_config(t)), "ms": ms})
    print(f"heads {heads} window {window} tokens {t} rows {n}: {min(ms):.4f} ms (runs {', '.join(f'{m:.4f}' for m in ms)}) {out[-1]['config']}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
