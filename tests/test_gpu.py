"""Real-size model and codec on a CUDA GPU with random weights (skipped without CUDA)."""

from __future__ import annotations


import pytest
import torch

from moss_tts.tools.random_inputs import random_prompt_rows

pytestmark = pytest.mark.gpu


def test_real_size_generation_and_decode_bf16(real_model):
    from moss_tts.codec.checkpoint import build_real_size_codec
    from moss_tts.model.generation import generate
    from moss_tts.contract.sampling_params import SamplingParams

    prompts = [random_prompt_rows(150, 1), random_prompt_rows(90, 2)]
    params = [SamplingParams(seed=5, max_frames=8, ignore_stop=True), SamplingParams.greedy(max_frames=6, ignore_stop=True)]
    out = generate(real_model, prompts, params)
    again = generate(real_model, prompts, params)
    assert [r.codes.shape for r in out] == [(8, 12), (6, 12)]
    assert all(torch.equal(a.codes, b.codes) for a, b in zip(out, again))
    codec = build_real_size_codec("cuda", torch.bfloat16)
    audio = codec.decode(out[0].codes.unsqueeze(0).cuda())
    assert audio.shape == (1, 2, 8 * 3840) and torch.isfinite(audio).all()
