"""Causal sliding-window transformer used by every codec stage (ProjectedTransformer).

Numerics follow the upstream codec: pre-LN layers (LayerNorm eps 1e-5), fused bias-free
qkv projection, RoPE on adjacent (even, odd) pairs computed in fp32, SDPA with the default
1/sqrt(head_dim) scale, LayerScale on both residual branches and an exact (erf) GELU FFN.
Module attribute names equal the on-disk tensor names, so state_dict() is the checkpoint layout.

Two attention paths share the weights:
- offline (`forward` without cache): whole sequence, window-masked, computed in blocks of
  `context` queries so memory is O(T x context) instead of O(T^2);
- streaming (`cache` given): new keys attend to a ring buffer of the last `context` keys.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import TransformerStage


def apply_rope(x: torch.Tensor, positions: torch.Tensor, max_period: float) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x [B, H, T, D] by positions [B, T] (absolute)."""
    d = x.shape[-1]
    freqs = torch.exp(torch.arange(d // 2, device=x.device, dtype=torch.float32)
                      * (-math.log(max_period) * 2 / d))
    angles = positions.to(torch.float32)[:, None, :, None] * freqs
    cos, sin = torch.cos(angles), torch.sin(angles)
    real, imag = x.float().unflatten(-1, (d // 2, 2)).unbind(-1)
    out = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)


def local_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Attention where query t sees keys t-window+1 .. t. Inputs [B, H, T, D]."""
    t = q.shape[2]
    if t <= window:  # the window cannot bind: plain causal attention
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # Query block i (positions iW .. iW+W-1) only needs keys of blocks i-1 and i.
    nb = -(-t // window)
    pad = nb * window - t
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    qb = q.unflatten(2, (nb, window))

    def two_blocks(x: torch.Tensor) -> torch.Tensor:
        prev = F.pad(x, (0, 0, window, 0))[:, :, : nb * window]
        return torch.cat([prev.unflatten(2, (nb, window)), x.unflatten(2, (nb, window))], dim=3)

    a = torch.arange(window, device=q.device).view(1, window, 1)
    b = torch.arange(2 * window, device=q.device).view(1, 1, 2 * window)
    block = torch.arange(nb, device=q.device).view(nb, 1, 1)
    # key b of block i sits at position (i-1)W + b; delta = a + W - b must lie in [0, W)
    mask = (b > a) & (b <= a + window) & (block * window + b - window >= 0)
    out = F.scaled_dot_product_attention(qb, two_blocks(k), two_blocks(v), attn_mask=mask)
    return out.flatten(2, 3)[:, :, :t]


class Attention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, context: int, max_period: float):
        super().__init__()
        self.num_heads, self.context, self.max_period = num_heads, context, max_period
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        b, t, _ = x.shape
        q, k, v = self.in_proj(x).view(b, t, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        return apply_rope(q, positions, self.max_period), apply_rope(k, positions, self.max_period), v

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        return self.out_proj(out.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device).expand(b, t)
        q, k, v = self._qkv(x, positions)
        return self._merge(local_causal_attention(q, k, v, self.context))

    def step(self, x: torch.Tensor, cache: torch.Tensor, offset: torch.Tensor,
             exec_mask: torch.Tensor) -> torch.Tensor:
        """Streaming chunk. cache [2, B, H, W, Dh] holds position p in slot p % W; offset [B]
        is the stream position of x[:, 0]. Rows with exec_mask False leave the cache untouched."""
        b, t, _ = x.shape
        w = self.context
        pos_q = offset[:, None] + torch.arange(t, device=x.device)
        q, k, v = self._qkv(x, pos_q)
        # Slot j holds the latest position p < offset with p % W == j (negative: never written).
        slot = torch.arange(w, device=x.device)
        pos_cached = offset[:, None] - 1 - torch.remainder(offset[:, None] - 1 - slot, w)
        pos_k = torch.cat([pos_cached, pos_q], dim=1)
        delta = pos_q[:, :, None] - pos_k[:, None, :]
        mask = (pos_k[:, None, :] >= 0) & (delta >= 0) & (delta < w)
        keys = torch.cat([cache[0].to(k.dtype), k], dim=2)
        values = torch.cat([cache[1].to(v.dtype), v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None])
        # Keep the last min(T, W) new keys; masked rows write back what they already hold.
        n = min(t, w)
        index = torch.remainder(pos_q[:, t - n:], w).view(1, b, 1, n, 1).expand(2, b, self.num_heads, n,
                                                                               cache.shape[-1])
        new = torch.stack([k, v])[:, :, :, t - n:].to(cache.dtype)
        keep = exec_mask.view(1, b, 1, 1, 1)
        cache.scatter_(3, index, torch.where(keep, new, cache.gather(3, index)))
        return self._merge(out)


class LayerScale(nn.Module):
    def __init__(self, channels: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((channels,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, s: TransformerStage):
        super().__init__()
        self.self_attn = Attention(s.d_model, s.num_heads, s.context, s.max_period)
        self.norm1 = nn.LayerNorm(s.d_model, eps=1e-5)
        self.norm2 = nn.LayerNorm(s.d_model, eps=1e-5)
        self.ffn = nn.Sequential(nn.Linear(s.d_model, s.dim_feedforward, bias=False), nn.GELU(),
                                 nn.Linear(s.dim_feedforward, s.d_model, bias=False))
        self.layer_scale_1 = LayerScale(s.d_model, s.layer_scale)
        self.layer_scale_2 = LayerScale(s.d_model, s.layer_scale)

    def forward(self, x: torch.Tensor, cache=None, offset=None, exec_mask=None) -> torch.Tensor:
        h = self.norm1(x)
        attn = self.self_attn(h) if cache is None else self.self_attn.step(h, cache, offset, exec_mask)
        x = x + self.layer_scale_1(attn)
        return x + self.layer_scale_2(self.ffn(self.norm2(x)))


class Transformer(nn.Module):
    def __init__(self, s: TransformerStage):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(s) for _ in range(s.num_layers))

    def forward(self, x: torch.Tensor, caches=None, offset=None, exec_mask=None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, None if caches is None else caches[i], offset, exec_mask)
        return x


class ProjectedTransformer(nn.Module):
    """Linear in -> transformer -> linear out, channel-last [B, T, C]. v2 keeps both
    projections even when dimensions match (the checkpoint stores them), unlike v1."""

    def __init__(self, s: TransformerStage):
        super().__init__()
        self.stage = s
        self.input_proj = nn.Linear(s.input_dimension, s.d_model, bias=False)
        self.transformer = Transformer(s)
        self.output_proj = nn.Linear(s.d_model, s.output_dimension, bias=False)

    def forward(self, x: torch.Tensor, caches=None, offset=None, exec_mask=None) -> torch.Tensor:
        return self.output_proj(self.transformer(self.input_proj(x), caches, offset, exec_mask))
