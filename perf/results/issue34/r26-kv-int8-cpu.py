"""Round 26, CPU measurement (dev box, no GPU): the built caches on the real-size random model's
backbone, everything else in fp32: StaticKVCache set up in fp32 (exact), bf16, fp8_e4m3 and int8
(kv_format's rules, through the engine's own torch paths: backbone.prefill / decode, no patching).
Round 25's experiment (r25-kv-quant-sim.py) simulated these rules by swapping the store rule; this
runs the code that serves them. 4 prompts of 60 random rows prefilled, then 8 decode steps fed the
prompts' next rows; the final-normed hidden state's relative error against the fp32 cache, overall
and by step. ~3 min, ~17 GB of RAM.

    PYTHONPATH=python_backends:tests:. python3 perf/results/issue34/r26-kv-int8-cpu.py
"""
import json
import sys
import time

import torch

from moss_tts.engine import backbone as bb
from moss_tts.engine.kv_cache import StaticKVCache
from moss_tts.kernels.fused import Fusions
from moss_tts.model.config import MossTTSConfig, real_model_config_dict
from moss_tts.model.loading import build_random_model
from moss_tts.tools.random_inputs import random_prompt_rows

torch.set_num_threads(2)
t0 = time.time()
cfg = MossTTSConfig.from_dict(real_model_config_dict(), "real")
model = build_random_model(cfg, "cpu", torch.float32, seed=0)
print("built", round(time.time() - t0), "s", flush=True)
N, P, D = 4, 60, 8
rows = torch.stack([random_prompt_rows(P + D, 900 + i) for i in range(N)])


def hidden(cache_dtype: torch.dtype) -> torch.Tensor:
    b = cfg.backbone
    cache = StaticKVCache(b.num_hidden_layers, N, P + D, b.num_key_value_heads, b.head_dim)
    cache.setup(torch.device("cpu"), cache_dtype)
    f, slots = Fusions.eager(), torch.arange(N)
    out = []
    with torch.inference_mode():
        e = model.embed_rows(rows)
        out.append(bb.prefill(model.transformer, f, cache, e[:, :P], slots, torch.full((N,), P)))
        for s in range(P, P + D):
            out.append(bb.decode(model.transformer, f, cache, e[:, s:s + 1], slots, torch.full((N,), s), P + D))
    return torch.stack(out)


exact = hidden(torch.float32)
results = {}
for name, dtype in (("bf16", torch.bfloat16), ("fp8_e4m3", torch.float8_e4m3fn), ("int8", torch.int8)):
    got = hidden(dtype)
    by_step = ((got - exact).norm(dim=(1, 2)) / exact.norm(dim=(1, 2))).tolist()
    results[name] = {"rel_err": ((got - exact).norm() / exact.norm()).item(), "by_step": by_step}
    print(name, "rel err", round(results[name]["rel_err"], 4), "by step", [round(v, 4) for v in by_step],
          round(time.time() - t0), "s", flush=True)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as fh:
        json.dump(results, fh, indent=2)
