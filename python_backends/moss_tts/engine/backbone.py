"""The Qwen3 backbone walked layer by layer over the engine's static, slot-major KV cache.

Same modules and the same op order as qwen3.Qwen3Backbone.forward (so results match the
reference loop), but keys/values go to each request's own slot and own length instead of
one batch-wide cache position.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..qwen3 import Qwen3Backbone, attention_bias
from .kv_cache import StaticKVCache

WriteFn = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _run_layers(backbone: Qwen3Backbone, x: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor,
                write: WriteFn) -> torch.Tensor:
    # Norm before slicing, as the reference does, so the reduction sees the same layout.
    return backbone.run(x, positions, bias, write)[:, -1]


def prefill(backbone: Qwen3Backbone, cache: StaticKVCache, slot: int, embeds: torch.Tensor,
            start: int) -> torch.Tensor:
    """Prompt rows [start, start+T) of one slot: embeds [1, T, H] -> last hidden [1, H]."""
    t, device = embeds.shape[1], embeds.device
    positions = torch.arange(start, start + t, device=device).unsqueeze(0)
    bias = attention_bias(torch.ones(1, start + t, dtype=torch.bool, device=device), t, embeds.dtype)
    return _run_layers(backbone, embeds, positions, bias,
                       lambda i, k, v: cache.write_range(i, slot, start, k, v))


def decode(backbone: Qwen3Backbone, cache: StaticKVCache, slots: torch.Tensor, positions: torch.Tensor,
           embeds: torch.Tensor, kv_len: int) -> torch.Tensor:
    """One row per slot at its own position: embeds [B, 1, H] -> hidden [B, H].

    kv_len (host int) = max(positions) + 1; each slot attends to its rows [0, position].
    """
    key_valid = torch.arange(kv_len, device=embeds.device).unsqueeze(0) <= positions.unsqueeze(1)
    bias = attention_bias(key_valid, 1, embeds.dtype)
    return _run_layers(backbone, embeds, positions.unsqueeze(1), bias,
                       lambda i, k, v: cache.write_rows(i, slots, positions, k, v, kv_len))
