"""Round 25, CPU experiment (dev box, no GPU): what quantizing only the KV cache does to the real-size
random model's backbone, with everything else in fp32. Three rules, applied by swapping the cache's
store rule (kv_format.to_cache, as the engine's torch paths call it) for a quantize-then-dequantize
one on an fp32 cache. That is a monkeypatch of module internals, for this measurement only, not a
served path:
- bf16: round to bf16;
- fp8_e4m3: kv_format's rule (clamp +-448, round to e4m3);
- int8_per_head: each (token, KV head) vector of 128 scaled by its absolute maximum to +-127 and
  rounded (a scale a vector, 2-4 bytes per 128).
4 prompts of 60 random rows prefilled, then 8 decode steps fed the prompts' next rows; the
final-normed hidden state's relative error against the exact cache. ~2 min, ~17 GB of RAM.

    PYTHONPATH=python_backends:tests:. python3 perf/results/issue34/r25-kv-quant-sim.py
"""
import time, torch
import test_kv_fp8 as t
from moss_tts.engine import kv_cache as kc, backbone as bb
from moss_tts.engine.kv_cache import StaticKVCache
from moss_tts.kernels import kv_format
from moss_tts.kernels.fused import Fusions
from moss_tts.model.config import MossTTSConfig, real_model_config_dict
from moss_tts.model.loading import build_random_model
from moss_tts.tools.random_inputs import random_prompt_rows
torch.set_num_threads(2)
t0=time.time()
cfg = MossTTSConfig.from_dict(real_model_config_dict(), "real")
model = build_random_model(cfg, "cpu", torch.float32, seed=0)
print("built", time.time()-t0, flush=True)
def fp8(x): return x.float().clamp(-448,448).to(torch.float8_e4m3fn).to(x.dtype)
def bf16(x): return x.to(torch.bfloat16).to(x.dtype)
def int8_head(x):
    s = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    return ((x.float() / s).round().clamp(-127,127) * s).to(x.dtype)
N, P, D = 4, 60, 8
rows = torch.stack([random_prompt_rows(P + D, 900 + i) for i in range(N)])
def hidden():
    b = cfg.backbone
    cache = StaticKVCache(b.num_hidden_layers, N, P + D, b.num_key_value_heads, b.head_dim)
    cache.setup(torch.device("cpu"), torch.float32)
    f, slots = Fusions.eager(), torch.arange(N)
    out = []
    with torch.inference_mode():
        e = model.embed_rows(rows)
        out.append(bb.prefill(model.transformer, f, cache, e[:, :P], slots, torch.full((N,), P)))
        for s in range(P, P + D):
            out.append(bb.decode(model.transformer, f, cache, e[:, s:s+1], slots, torch.full((N,), s), P + D))
    return torch.stack(out)
exact = hidden(); print("exact", time.time()-t0, flush=True)
orig_to, orig_as = kc.to_cache, kc.StaticKVCache.as_stored
for name, q in (("bf16", bf16), ("fp8_e4m3", fp8), ("int8_per_head", int8_head)):
    kc.to_cache = lambda x, dtype, q=q: q(x).to(dtype); bb.to_cache = kc.to_cache
    kc.StaticKVCache.as_stored = lambda self, x, q=q: q(x)
    got = hidden()
    kc.to_cache, bb.to_cache, kc.StaticKVCache.as_stored = orig_to, orig_to, orig_as
    print(name, "rel err", ((got-exact).norm()/exact.norm()).item(), "by step", [round(v,4) for v in ((got-exact).norm(dim=(1,2))/exact.norm(dim=(1,2))).tolist()], flush=True)
