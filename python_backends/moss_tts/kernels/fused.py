"""The pointwise chains of a step as small pure functions, optionally compiled into fused kernels.

Each function repeats, op for op, what the model's modules do (qwen3.RMSNorm, apply_neox_rope,
the SwiGLU MLP), so run eagerly they give the modules' results; the sampling steps are the
sampler's own functions (sampler.temperature_scores, sampler.draw), compiled as they are. A
decode step launches ~1,000 kernels instead of ~3,000 when they are compiled: on a GPU most of
a small-batch step is launch gaps between tiny kernels, not arithmetic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..model.local_transformer import apply_interleaved_rope
from ..model.qwen3 import apply_neox_rope
from ..model.sampler import apply_repetition_penalty, draw, temperature_scores
from . import gated_silu

RECOMPILE_LIMIT = 32  # specialisations per fused function (a handful are used)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """Residual add, then the next norm: (x + delta, rms_norm(x + delta))."""
    x = x + delta
    return x, rms_norm(x, weight, eps)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 eps: float, cos: torch.Tensor, sin: torch.Tensor):
    """q [B, T, heads, d], k [B, T, kv_heads, d] -> per-head RMSNorm, then NeoX rotation."""
    q = apply_neox_rope(rms_norm(q, q_weight, eps), cos, sin)
    return q, apply_neox_rope(rms_norm(k, k_weight, eps), cos, sin)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def silu_mul_merged(gate_up: torch.Tensor) -> torch.Tensor:
    """silu_mul of the merged gate/up projection's output [..., 2 x intermediate]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def add_layer_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float):
    """Residual add, then the next LayerNorm: (x + delta, layer_norm(x + delta))."""
    x = x + delta
    return x, layer_norm(x, weight, bias, eps)


def local_qkv_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int):
    """LocalAttention's split of c_attn's output [B, T, 3H] and its interleaved RoPE of q and k:
    q, k, v [B, T, heads, head_dim]."""
    b, t, width = qkv.shape
    q, k, v = qkv.split(width // 3, dim=-1)
    head_dim = width // 3 // num_heads
    q = apply_interleaved_rope(q.reshape(b, t, num_heads, head_dim), cos, sin)
    k = apply_interleaved_rope(k.reshape(b, t, num_heads, head_dim), cos, sin)
    return q, k, v.reshape(b, t, num_heads, head_dim)


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """LocalAttention's attention of one new row over local positions [0, P), as the module
    computes it: q [B, 1, heads, d], k/v [B, P, heads, d] -> [B, 1, heads, d]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


def local_attention_reduced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """local_attention as plain fp32 reductions, for compiling into one small kernel: for at
    most 13 keys SDPA launched a cuDNN or flash kernel of 70-140 us at batch 256 (H200
    profile), about 1 ms of every step. Same math, rounding may differ in the last bits."""
    scale = q.shape[-1] ** -0.5
    scores = (q.float() * k.float()).sum(-1) * scale  # [B, P, heads]
    weights = torch.softmax(scores, dim=1).unsqueeze(-1)
    return (weights * v.float()).sum(1, keepdim=True).to(q.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def select_stop(*args) -> torch.Tensor:
    """sampler.draw for the 2-way stop head: its own compiled code, so the vocab-2 shapes do
    not add specialisations to the codebooks' one."""
    return draw(*args)


def penalized_scores(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor,
                     temperature: torch.Tensor):
    """sampler.apply_repetition_penalty on float logits, then temperature_scores: one kernel."""
    return temperature_scores(apply_repetition_penalty(logits.float(), seen, penalty), temperature)


@dataclass(frozen=True)
class Fusions:
    """The functions a step calls; compiled on a GPU when fuse_kernels is on."""

    rms_norm: Callable
    add_rms_norm: Callable
    qk_norm_rope: Callable
    silu_mul: Callable
    silu_mul_merged: Callable
    layer_norm: Callable
    add_layer_norm: Callable
    local_qkv_rope: Callable
    local_attention: Callable
    silu: Callable
    select_token: Callable  # sampler.draw
    select_stop: Callable
    temperature_scores: Callable
    penalized_scores: Callable
    is_compiled: bool

    @classmethod
    def eager(cls) -> "Fusions":
        return cls(rms_norm, add_rms_norm, qk_norm_rope, silu_mul, silu_mul_merged, layer_norm, add_layer_norm,
                   local_qkv_rope, local_attention, silu, draw, select_stop, temperature_scores, penalized_scores,
                   False)

    @classmethod
    def compiled(cls) -> "Fusions":
        return _compiled_fusions()

    @classmethod
    def for_device(cls, device: torch.device, enabled: bool) -> "Fusions":
        return cls.compiled() if enabled and device.type == "cuda" else cls.eager()


@functools.cache
def _compiled_fusions() -> Fusions:
    """One set per process: every engine shares the compiled kernels instead of compiling again.

    dynamic=True: one kernel set serves every batch bucket; only batch 1 (and the prefill's
    [N, T] layouts) add a specialisation. Inputs are never slices at varying offsets (each
    offset would be a recompile); the raised limit is a margin, not a budget.
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)

    def fuse(fn):
        return torch.compile(fn, dynamic=True, fullgraph=True)
    # The two SiLU passes of a step are plain Triton kernels (gated_silu): compiled with dynamic
    # shapes they ran at a quarter of their bandwidth (H200 profile, 2026-12-03).
    return Fusions(fuse(rms_norm), fuse(add_rms_norm), fuse(qk_norm_rope), fuse(silu_mul),
                   gated_silu.silu_mul_merged, fuse(layer_norm), fuse(add_layer_norm), fuse(local_qkv_rope),
                   fuse(local_attention_reduced), gated_silu.silu,
                   fuse(draw), fuse(select_stop), fuse(temperature_scores),
                   fuse(penalized_scores), True)
