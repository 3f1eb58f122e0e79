"""The Qwen3 backbone walked layer by layer over the engine's static, slot-major KV cache.

Same modules and the same op order as qwen3.Qwen3Backbone.forward (so results match the
reference loop), but keys/values go to each request's own slot and own length instead of
one batch-wide cache position.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..qwen3 import Qwen3Attention, Qwen3Backbone, apply_neox_rope, attention_bias, neox_rope
from .kv_cache import StaticKVCache

WriteFn = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _project_qkv(attn: Qwen3Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    b, t, _ = x.shape
    c = attn.cfg
    q = attn.q_norm(attn.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim))
    k = attn.k_norm(attn.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim))
    v = attn.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim)
    return apply_neox_rope(q, cos, sin), apply_neox_rope(k, cos, sin), v


def _attend(attn: Qwen3Attention, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            bias: torch.Tensor) -> torch.Tensor:
    b, t = q.shape[:2]
    groups = attn.cfg.num_attention_heads // attn.cfg.num_key_value_heads
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        keys.repeat_interleave(groups, dim=2).transpose(1, 2),
        values.repeat_interleave(groups, dim=2).transpose(1, 2),
        attn_mask=bias,
    )
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def _run_layers(backbone: Qwen3Backbone, x: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor,
                write: WriteFn) -> torch.Tensor:
    cfg = backbone.cfg
    cos, sin = neox_rope(positions, cfg.head_dim, cfg.rope_theta, x.dtype)
    for i, layer in enumerate(backbone.layers):
        attn = layer.self_attn
        q, k, v = _project_qkv(attn, layer.input_layernorm(x), cos, sin)
        keys, values = write(i, k, v)
        x = x + _attend(attn, q, keys, values, bias)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    # Norm before slicing, as the reference does, so the reduction sees the same layout.
    return backbone.norm(x)[:, -1]


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
