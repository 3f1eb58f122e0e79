"""What an fp8 or int8 KV cache (EngineConfig.kv_cache_dtype "fp8_e4m3" / "int8", kernels/kv_format.py)
does to the engine's computation, beside what bf16 already does, all against an fp32 reference.

    PYTHONPATH=python_backends python3 perf/bench_kv_fidelity.py --out F.json     # GPU, ~2 min
    PYTHONPATH=python_backends python3 perf/bench_kv_fidelity.py --tiny           # CPU smoke

Two measures, on the real-size model with random weights (seed 0), each model built from the same
seed in fp32 and in bf16:
- hidden: `count` prompts of `prompt_rows` random rows prefilled, then `steps` decode steps each
  fed the prompt's next row (teacher forcing, so every variant sees the same inputs); the final-normed
  hidden state of the prefill and of every step. fp32: the torch path (masked SDPA, fp32 cache).
  bf16: the served path (fused kernels, the prefill and decode kernels) over a bf16 cache, then over
  each byte cache (--variants). Reported: relative error (whole batch, and the worst row), the lowest cosine.
- greedy codes: the same prompts through an engine (greedy, `frames` frames, stop ignored) in bf16
  with each cache, against generation.generate on the fp32 model: frame-0 codes equal (the
  prefill's effect) and leading frames equal per prompt.
Random weights: how far a byte cache moves the computation, not what a listener would hear from
the trained model (issue 34 states this with the numbers, perf/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine import CodesChunk, Engine, EngineConfig, EngineRequest, Finished, backbone
from moss_tts.engine.kv_cache import StaticKVCache
from moss_tts.kernels import kv_format
from moss_tts.kernels.fused import Fusions
from moss_tts.model.config import MossTTSConfig, real_model_config_dict
from moss_tts.model.generation import generate
from moss_tts.model.loading import build_random_model
from moss_tts.tools.random_inputs import random_prompt_rows

VARIANTS = kv_format.KV_CACHE_DTYPES
TIMEOUT_S = 600


def hidden_states(model, prompts: torch.Tensor, steps: int, kv_cache_dtype: str, served: bool) -> torch.Tensor:
    """[1 + steps, N, H] fp32: the prefill's last hidden state, then each decode step's."""
    n, rows = prompts.shape[0], prompts.shape[1] - steps
    b, device = model.cfg.backbone, prompts.device
    cache = StaticKVCache(b.num_hidden_layers, n, rows + steps, b.num_key_value_heads, b.head_dim)
    cache.setup(device, kv_format.cache_dtype(kv_cache_dtype, model.dtype))
    fusions = Fusions.for_device(device, served)
    slots = torch.arange(n, device=device)
    out = []
    with torch.inference_mode():
        backbone.merge_projections(model.transformer)
        embeds = model.embed_rows(prompts).to(model.dtype)
        out.append(backbone.prefill(model.transformer, fusions, cache, embeds[:, :rows], slots,
                                    torch.full((n,), rows, device=device), use_kernel=served))
        for t in range(rows, rows + steps):
            out.append(backbone.decode(model.transformer, fusions, cache, embeds[:, t:t + 1], slots,
                                       torch.full((n,), t, device=device), rows + steps, use_kernel=served,
                                       qkv_kernel=served))
    return torch.stack(out).float()


def hidden_errors(got: torch.Tensor, ref: torch.Tensor) -> dict:
    rows_err = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    return {"rel_err": ((got - ref).norm() / ref.norm()).item(), "rel_err_max_row": rows_err.max().item(),
            "cos_min": cos.min().item(), "rel_err_by_step": [round(x, 5) for x in
                                                              ((got - ref).norm(dim=(1, 2)) / ref.norm(dim=(1, 2))).tolist()]}


def engine_codes(model, prompts: list[torch.Tensor], frames: int, kv_cache_dtype: str) -> list[torch.Tensor]:
    chunks: dict[str, list] = {}
    done = []

    def on_event(event):
        if isinstance(event, Finished):
            done.append(event.request_id)
        elif isinstance(event, CodesChunk):
            chunks.setdefault(event.request_id, []).append(torch.as_tensor(event.codes).long())

    config = EngineConfig(max_running_requests=len(prompts), max_seq_len=max(len(p) for p in prompts) + frames + 8,
                          kv_cache_dtype=kv_cache_dtype, cuda_graph_prefill_tokens=0)
    engine = Engine(model, config, on_event)
    for i, p in enumerate(prompts):
        engine.submit(EngineRequest(f"p{i}", p, SamplingParams.greedy(max_frames=frames, ignore_stop=True)))
    engine.start()
    deadline = time.monotonic() + TIMEOUT_S
    while len(done) < len(prompts) and time.monotonic() < deadline:
        time.sleep(0.05)
    engine.shutdown(TIMEOUT_S)
    if len(done) < len(prompts):
        raise RuntimeError(f"the engine finished {len(done)} of {len(prompts)} requests in {TIMEOUT_S} s")
    return [torch.cat(chunks[f"p{i}"]) for i in range(len(prompts))]


def leading_equal(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    same = (a[:n] == b[:n]).all(dim=-1)
    return int(n if same.all() else same.long().argmin())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run on the tiny random model")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--prompt-rows", type=int, default=150)
    ap.add_argument("--steps", type=int, default=32,
                    help="rows past --prompt-rows in the longest of 4 prompt lengths; the hidden measure decodes "
                         "steps - 9 of them (the shortest prompt's tail, common to all: 23 by default)")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"caches to measure, of {VARIANTS}")
    args = ap.parse_args(argv)
    if args.tiny:
        from moss_tts.tools.make_tiny_checkpoint import tiny_model_config_dict

        cfg, device, std = MossTTSConfig.from_dict(tiny_model_config_dict(), "tiny"), "cpu", 0.15
    else:
        cfg, device, std = MossTTSConfig.from_dict(real_model_config_dict(), "real"), "cuda", None
    build = (lambda dtype: build_random_model(cfg, device, dtype, seed=0, std=std)) if std else \
        (lambda dtype: build_random_model(cfg, device, dtype, seed=0))
    rows = [random_prompt_rows(args.prompt_rows + args.steps - 3 * (i % 4), 900 + i) for i in range(args.count)]
    # hidden: one length for all, the shortest random prompt's (prompt_rows + steps - 9 rows); the last
    # steps - 9 rows are teacher-forced. greedy codes: each prompt cut at prompt_rows - 0/3/6/9 rows.
    teacher = torch.stack([r[:args.prompt_rows + args.steps - 9] for r in rows]).to(device)
    prompts = [r[:args.prompt_rows - 3 * (i % 4)] for i, r in enumerate(rows)]
    served = device == "cuda"
    greedy = [SamplingParams.greedy(max_frames=args.frames, ignore_stop=True)] * args.count
    start = time.perf_counter()
    model = build(torch.float32)
    ref_hidden = hidden_states(model, teacher, args.steps - 9, "auto", served=False)
    with torch.inference_mode():
        ref_codes = [r.codes for r in generate(model, prompts, greedy)]
    del model
    if served:
        torch.cuda.empty_cache()
    model = build(torch.float32 if args.tiny else torch.bfloat16)
    results: dict = {"meta": {"device": torch.cuda.get_device_name() if served else "cpu", "torch": torch.__version__,
                              "count": args.count, "prompt_rows": args.prompt_rows, "steps": args.steps - 9,
                              "frames": args.frames, "model_dtype": str(model.dtype)}}
    for kv in args.variants.split(","):
        got = hidden_states(model, teacher, args.steps - 9, kv, served)
        codes = engine_codes(model, prompts, args.frames, kv)
        results[kv] = {"hidden": hidden_errors(got, ref_hidden),
                       "frame0_codes_equal": sum(int((c[0] == r[0]).sum()) for c, r in zip(codes, ref_codes)),
                       "frame0_codes": sum(int(r[0].numel()) for r in ref_codes),
                       "leading_frames_equal": [leading_equal(c, r) for c, r in zip(codes, ref_codes)]}
        h = results[kv]["hidden"]
        print(f"{kv:9s} vs fp32: hidden rel. error {h['rel_err']:.4f} (worst row {h['rel_err_max_row']:.4f}, "
              f"cos min {h['cos_min']:.5f}); greedy frame-0 codes equal {results[kv]['frame0_codes_equal']}/"
              f"{results[kv]['frame0_codes']}; leading frames equal {results[kv]['leading_frames_equal']} "
              f"of {args.frames}", flush=True)
    results["meta"]["seconds"] = time.perf_counter() - start
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
