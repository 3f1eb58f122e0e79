"""The local transformer: a pre-LN GPT-2 block that runs 12 micro-steps per frame.

Position 0 consumes the backbone's last hidden state; position c (1..11) consumes the
embedding of code c-1. RoPE here pairs adjacent dims (GPT-J, interleaved), unlike the
backbone's half-split NeoX rotation. Names follow the checkpoint (`local_transformer.h.0.*`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import LocalTransformerConfig


def interleaved_rope(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype):
    """cos/sin [B, T, 1, head_dim] where dims 2i and 2i+1 share frequency i."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float32) / head_dim))
    freqs = positions.float().unsqueeze(-1) * inv_freq
    cos = freqs.cos().repeat_interleave(2, dim=-1).unsqueeze(2)
    sin = freqs.sin().repeat_interleave(2, dim=-1).unsqueeze(2)
    return cos.to(dtype), sin.to(dtype)


def apply_interleaved_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).reshape_as(x)
    return x * cos + rotated * sin


class LocalKVCache:
    """Keys/values of one frame's micro-steps [B, capacity, heads, head_dim]; refilled every frame."""

    def __init__(self, batch: int, capacity: int, heads: int, head_dim: int, device, dtype) -> None:
        self.k = torch.zeros(batch, capacity, heads, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)


class LocalAttention(nn.Module):
    def __init__(self, cfg: LocalTransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos, sin, cache: LocalKVCache, pos: int) -> torch.Tensor:
        """x [B, 1, H] at micro-step `pos`; attends to cache[:, :pos+1] (always causal)."""
        b, t, h = x.shape
        c = self.cfg
        q, k, v = self.c_attn(x).split(h, dim=-1)
        q = apply_interleaved_rope(q.view(b, t, c.num_heads, c.head_dim), cos, sin)
        k = apply_interleaved_rope(k.view(b, t, c.num_heads, c.head_dim), cos, sin)
        cache.k[:, pos:pos + t] = k
        cache.v[:, pos:pos + t] = v.view(b, t, c.num_heads, c.head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            cache.k[:, :pos + t].transpose(1, 2),
            cache.v[:, :pos + t].transpose(1, 2),
            is_causal=t > 1,
        )
        return self.c_proj(out.transpose(1, 2).reshape(b, t, h))


class LocalMLP(nn.Module):
    def __init__(self, cfg: LocalTransformerConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.silu(self.fc_in(x)))


class LocalBlock(nn.Module):
    def __init__(self, cfg: LocalTransformerConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.attn = LocalAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = LocalMLP(cfg)

    def forward(self, x, cos, sin, cache: LocalKVCache, pos: int) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cos, sin, cache, pos)
        return x + self.mlp(self.ln_2(x))


class LocalTransformer(nn.Module):
    def __init__(self, cfg: LocalTransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.h = nn.ModuleList(LocalBlock(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def new_caches(self, batch: int, capacity: int, device, dtype) -> list[LocalKVCache]:
        c = self.cfg
        return [LocalKVCache(batch, capacity, c.num_heads, c.head_dim, device, dtype) for _ in self.h]

    def step(self, x: torch.Tensor, caches: list[LocalKVCache], pos: int) -> torch.Tensor:
        """One micro-step: x [B, H] at local position `pos` -> hidden [B, H] after ln_f."""
        positions = torch.full((x.shape[0], 1), pos, device=x.device, dtype=torch.long)
        cos, sin = interleaved_rope(positions, self.cfg.head_dim, self.cfg.rope_base, x.dtype)
        h = x.unsqueeze(1)
        for block, cache in zip(self.h, caches):
            h = block(h, cos, sin, cache, pos)
        return self.ln_f(h).squeeze(1)
