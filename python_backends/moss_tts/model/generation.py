"""The reference generation loop: eager, batched with left padding, one KV cache.

This is the ground truth later optimisations are compared against, so it stays plain:
prefill every prompt together, then one backbone step + one local frame per iteration
until every row has stopped or used its frame budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract.sampling_params import SamplingParams
from .sampler import FrameSampling
from .tts_model import MossTTSLocalModel


@dataclass(frozen=True)
class GenerationResult:
    codes: torch.Tensor  # [frames, n_vq] int64, CPU
    finish_reason: str  # "stop" (the model chose to end) or "max_frames"


def left_pad(prompts: list[torch.Tensor], pad_token: int, pad_code: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt rows [T_i, 13] -> batch [B, T, 13] padded on the left with [pad, 1024 x 12], mask [B, T]."""
    width = prompts[0].shape[1]
    length = max(p.shape[0] for p in prompts)
    rows = torch.full((len(prompts), length, width), pad_code, dtype=torch.long)
    rows[..., 0] = pad_token
    mask = torch.zeros(len(prompts), length, dtype=torch.bool)
    for i, p in enumerate(prompts):
        rows[i, length - p.shape[0]:] = p
        mask[i, length - p.shape[0]:] = True
    return rows, mask


@torch.inference_mode()
def generate(model: MossTTSLocalModel, prompts: list[torch.Tensor],
             params: list[SamplingParams]) -> list[GenerationResult]:
    """Prompt rows [T_i, 13] + per-request parameters -> generated codes per request."""
    if len(prompts) != len(params) or not prompts:
        raise ValueError("generate() needs one SamplingParams per prompt and at least one prompt")
    cfg = model.cfg
    device = model.local_text_lm_head.weight.device
    rows, mask = left_pad(prompts, cfg.pad_token_id, cfg.audio_pad_code)
    rows, mask = rows.to(device), mask.to(device)
    batch, prompt_len = mask.shape
    budget = max(p.max_frames for p in params)

    caches = model.transformer.new_caches(batch, prompt_len + budget, device, model.dtype)
    key_valid = torch.zeros(batch, prompt_len + budget, dtype=torch.bool, device=device)
    key_valid[:, :prompt_len] = mask
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    hidden = model.transformer(model.embed_rows(rows).to(model.dtype), positions, mask, caches, 0)[:, -1]

    state = FrameSampling.build(params, cfg.n_vq, cfg.audio_vocab_size, device)
    max_frames = torch.tensor([p.max_frames for p in params], device=device)
    ignore_stop = torch.tensor([p.ignore_stop for p in params], device=device)
    next_pos = mask.sum(-1)
    count = torch.zeros(batch, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    stopped = torch.zeros_like(finished)
    frames: list[torch.Tensor] = []

    for step in range(budget):
        is_stop, codes = model.sample_frame(hidden, state, count)
        is_stop &= ~ignore_stop
        emit = ~finished & ~is_stop
        stopped |= ~finished & is_stop
        finished |= is_stop
        if not bool(emit.any()):  # one sync per frame is fine in the reference loop
            break
        frames.append(codes)
        state.record(codes, emit)
        count += emit.long()
        finished |= count >= max_frames
        key_valid[:, prompt_len + step] = emit
        step_rows = model.feedback_rows(codes, emit).unsqueeze(1)
        hidden = model.transformer(model.embed_rows(step_rows).to(model.dtype), next_pos.unsqueeze(1),
                                   key_valid[:, :prompt_len + step + 1], caches, prompt_len + step)[:, -1]
        next_pos += emit.long()

    all_codes = torch.stack(frames, dim=1).cpu() if frames else torch.zeros(batch, 0, cfg.n_vq, dtype=torch.long)
    count, stopped = count.cpu(), stopped.cpu()
    # Rows emit contiguously from frame 0, so a row's codes are its first `count` frames.
    return [GenerationResult(all_codes[i, :int(count[i])].clone(), "stop" if stopped[i] else "max_frames")
            for i in range(batch)]
