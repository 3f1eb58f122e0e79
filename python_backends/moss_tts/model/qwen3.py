"""Qwen3 decoder (the MOSS-TTS backbone): GQA, per-head q/k RMSNorm, NeoX RoPE, SwiGLU.

Module and parameter names follow the checkpoint (`transformer.embed_tokens`,
`transformer.layers.{i}.self_attn.q_proj`, ...), so a state dict loads without renaming.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import Qwen3Config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32, cast back, then scale: the order the checkpoint was trained with.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def neox_rope(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin [B, T, 1, head_dim] for half-split (NeoX) rotation at integer positions [B, T]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                              dtype=torch.float32) / head_dim))
    freqs = positions.float().unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(2)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_neox_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class KVCache(nn.Module):
    """Preallocated keys/values [B, max_len, kv_heads, head_dim] of one layer, written in place."""

    def __init__(self, batch: int, max_len: int, kv_heads: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        shape = (batch, max_len, kv_heads, head_dim)
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = start + k.shape[1]
        self.k[:, start:end] = k
        self.v[:, start:end] = v
        return self.k[:, :end], self.v[:, :end]


def attention_bias(key_valid: torch.Tensor, q_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, q_len, K]: causal over the last q_len keys and key padding.

    A finite minimum (not -inf) keeps fully masked padding queries finite, so padding can
    never turn into NaN that leaks through 0 * NaN.
    """
    k_len = key_valid.shape[1]
    q_pos = torch.arange(q_len, device=key_valid.device) + (k_len - q_len)
    k_pos = torch.arange(k_len, device=key_valid.device)
    allowed = (k_pos[None, :] <= q_pos[:, None])[None] & key_valid[:, None, :]
    bias = torch.zeros(allowed.shape, device=key_valid.device, dtype=dtype)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)


KVWrite = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor, cos, sin):
        """x [B, T, H] -> q [B, T, heads, d], k and v [B, T, kv_heads, d], q/k normed and rotated."""
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_norm(self.q_proj(x).view(b, t, c.num_attention_heads, c.head_dim))
        k = self.k_norm(self.k_proj(x).view(b, t, c.num_key_value_heads, c.head_dim))
        v = self.v_proj(x).view(b, t, c.num_key_value_heads, c.head_dim)
        return apply_neox_rope(q, cos, sin), apply_neox_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """GQA attention of q [B, T, heads, d] over keys/values [B, K, kv_heads, d] -> [B, T, H]."""
        b, t = q.shape[:2]
        groups = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys.repeat_interleave(groups, dim=2).transpose(1, 2),
            values.repeat_interleave(groups, dim=2).transpose(1, 2),
            attn_mask=bias,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x, cos, sin, bias, write: "KVWrite") -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        keys, values = write(k, v)
        return self.attend(q, keys, values, bias)


class Qwen3MLP(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3Layer(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(cfg)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, bias, write: "KVWrite"):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, bias, write)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Backbone(nn.Module):
    """Embeddings in, final-normed hidden states out; the caller owns positions and masks."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def new_caches(self, batch: int, max_len: int, device, dtype) -> list[KVCache]:
        c = self.cfg
        return [KVCache(batch, max_len, c.num_key_value_heads, c.head_dim, device, dtype)
                for _ in range(c.num_hidden_layers)]

    def run(self, embeds: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor,
            write: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """All layers + final norm. `write(layer, k, v)` stores the new keys/values wherever the
        caller keeps its cache and returns every key/value the queries attend to."""
        cos, sin = neox_rope(positions, self.cfg.head_dim, self.cfg.rope_theta, embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, bias, lambda k, v, i=i: write(i, k, v))
        return self.norm(x)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor,
                caches: list[KVCache] | None = None, start: int = 0) -> torch.Tensor:
        """embeds [B, T, H]; positions [B, T]; key_valid [B, start+T] (False = padding).

        With caches, the T new keys are written at [start, start+T) and attention covers
        [0, start+T); without, attention covers the T inputs only (start must be 0).
        """
        bias = attention_bias(key_valid, embeds.shape[1], embeds.dtype)
        if caches is None:
            return self.run(embeds, positions, bias, lambda i, k, v: (k, v))
        return self.run(embeds, positions, bias, lambda i, k, v: caches[i].update(start, k, v))
