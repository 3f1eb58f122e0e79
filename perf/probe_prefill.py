"""Where the first eager batched prefill of a new shape spends its time (GPU diagnostic).

    PYTHONPATH=python_backends python3 perf/probe_prefill.py

Builds the real-size model (random weights, bf16) and an eager runner (no graphs), then runs
prefills of new and repeated prompt counts: host launch time, total time, device allocator
calls (cudaMalloc/cudaFree) and, for one first-time shape, a cProfile of the host side.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import time

import torch

from moss_tts.engine import EngineConfig, step
from moss_tts.engine.runner import ModelRunner
from moss_tts.model.config import MossTTSConfig, real_model_config_dict
from moss_tts.model.loading import build_random_model

PROMPT_ROWS = 160


def timed_prefill(runner: ModelRunner, num_prompts: int) -> dict:
    inputs = runner._dummy_inputs(num_prompts, PROMPT_ROWS)
    before = torch.cuda.memory_stats()
    torch.cuda.synchronize()
    start = time.perf_counter()
    step.prefill_step(runner.ctx, inputs)
    launched = time.perf_counter()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    return {"prompts": num_prompts, "host_ms": round((launched - start) * 1000, 1),
            "total_ms": round((time.perf_counter() - start) * 1000, 1),
            "cuda_mallocs": after["num_device_alloc"] - before["num_device_alloc"],
            "cuda_frees": after["num_device_free"] - before["num_device_free"]}


def main() -> None:
    cfg = MossTTSConfig.from_dict(real_model_config_dict(), "real")
    model = build_random_model(cfg, "cuda", torch.bfloat16, seed=0)
    runner = ModelRunner(model, EngineConfig(max_running_requests=256, max_seq_len=384,
                                             prefill_chunk_tokens=8192, enforce_eager=True))
    start = time.perf_counter()
    runner.setup()
    print(f"alloc conf {os.environ.get('PYTORCH_CUDA_ALLOC_CONF')!r}, setup {time.perf_counter() - start:.1f} s")
    with torch.inference_mode():
        for n in (37, 37, 45, 45, 23):
            print(timed_prefill(runner, n), flush=True)
        profiler = cProfile.Profile()
        profiler.enable()
        print("profiled:", timed_prefill(runner, 51))
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    print("\n".join(line[:160] for line in text.getvalue().splitlines()[:40]))


if __name__ == "__main__":
    main()
