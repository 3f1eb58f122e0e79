"""Real-size model and codec on a CUDA GPU with random weights (skipped without CUDA)."""

from __future__ import annotations

import time

import pytest
import torch

from moss_tts.tools.random_inputs import random_prompt_rows

pytestmark = pytest.mark.gpu


def test_real_size_generation_and_decode_bf16(real_model):
    from moss_tts.codec.checkpoint import build_real_size_codec
    from moss_tts.generation import generate
    from moss_tts.sampling_params import SamplingParams

    prompts = [random_prompt_rows(150, 1), random_prompt_rows(90, 2)]
    params = [SamplingParams(seed=5, max_frames=8, ignore_stop=True), SamplingParams.greedy(max_frames=6, ignore_stop=True)]
    out = generate(real_model, prompts, params)
    again = generate(real_model, prompts, params)
    assert [r.codes.shape for r in out] == [(8, 12), (6, 12)]
    assert all(torch.equal(a.codes, b.codes) for a, b in zip(out, again))
    codec = build_real_size_codec("cuda", torch.bfloat16)
    audio = codec.decode(out[0].codes.unsqueeze(0).cuda())
    assert audio.shape == (1, 2, 8 * 3840) and torch.isfinite(audio).all()


@pytest.mark.parametrize("batch", [1, 16])
def test_naive_loop_speed_is_reported(real_model, batch):
    """Not a speed assertion: prints the eager reference loop's frames/s (baseline for perf/)."""
    from moss_tts.generation import generate
    from moss_tts.sampling_params import SamplingParams

    prompts = [random_prompt_rows(150, i) for i in range(batch)]
    params = [SamplingParams(seed=i, max_frames=24, ignore_stop=True) for i in range(batch)]
    generate(real_model, prompts[:1], [SamplingParams(seed=0, max_frames=2, ignore_stop=True)])
    torch.cuda.synchronize()
    start = time.perf_counter()
    generate(real_model, prompts, params)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    frames = 24 * batch
    print(f"\nnaive eager loop, batch {batch}: {frames / seconds:.1f} frames/s, "
          f"{frames / 12.5 / seconds:.2f} audio-s/s ({seconds / 24 * 1000:.1f} ms per step incl. prefill)")
