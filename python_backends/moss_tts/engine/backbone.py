"""The Qwen3 backbone walked layer by layer over the engine's static, slot-major KV cache.

The model's own modules and weights, in the op order of qwen3.Qwen3Backbone, with two changes
for a batched step: the pointwise chains come from `Fusions` (fused kernels on a GPU), and a
decode step attends straight from the cache — one query row per slot over a fixed window of
keys with a mask, the 4 query heads of each KV head batched together — so nothing of the cache
is gathered or repeated per step and the shapes stay fixed for a CUDA graph.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..kernels import decode_attention, prefill_attention, step_qkv
from ..kernels.fused import Fusions
from ..model.qwen3 import Qwen3Backbone, Qwen3Layer, attention_bias, neox_rope
from .kv_cache import StaticKVCache

# attend(layer, q [B, T, heads, d], k, v [B, T, kv_heads, d]) -> o_proj output [B, T, H]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# attend_qkv(layer, qkv [B, T, (heads + 2 kv_heads) d] raw from the merged GEMM, cos, sin) -> the
# same: norms, RoPE, the cache write and attention all its own (a decode step's Triton kernels)
AttendQkvFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class MergedProjections:
    """One layer's q/k/v weights as one matrix and gate/up as another: a step then runs 4 GEMMs
    per layer instead of 7, with wider tiles at decode batch sizes. The modules' own weights
    become views into these, so the model keeps working unchanged and nothing is stored twice."""

    def __init__(self, layer: Qwen3Layer) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _merge(attn.q_proj, attn.k_proj, attn.v_proj)
        self.gate_up = _merge(mlp.gate_proj, mlp.up_proj)
        self.q_rows, self.kv_rows = attn.q_proj.out_features, attn.k_proj.out_features


def _merge(*linears: torch.nn.Linear) -> torch.Tensor:
    merged = torch.cat([m.weight.detach() for m in linears])
    start = 0
    for m in linears:
        m.weight = torch.nn.Parameter(merged[start:start + m.out_features], requires_grad=False)
        start += m.out_features
    return merged


def merge_projections(backbone: Qwen3Backbone) -> list[MergedProjections]:
    """Once per model, before any graph capture (the concatenation must not be recorded)."""
    merged = getattr(backbone, "_engine_merged", None)
    if merged is None:
        merged = [MergedProjections(layer) for layer in backbone.layers]
        backbone._engine_merged = merged
    return merged


def _layer(layer: Qwen3Layer, x, h, cos, sin, attend, f: Fusions, next_norm: torch.Tensor,
           merged: MergedProjections | None, attend_qkv=None):
    """One layer from (residual x, normed h); returns (x, the next norm of x). attend_qkv (with
    merged projections only) takes the qkv GEMM's output as it is."""
    attn, mlp, c = layer.self_attn, layer.mlp, layer.self_attn.cfg
    b, t, _ = h.shape
    if attend_qkv is not None and merged is not None:
        attended = attend_qkv(F.linear(h, merged.qkv), cos, sin)
    else:
        if merged is None:
            q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        else:
            q, k, v = F.linear(h, merged.qkv).split([merged.q_rows, merged.kv_rows, merged.kv_rows], dim=-1)
        q = q.reshape(b, t, c.num_attention_heads, c.head_dim)
        k = k.reshape(b, t, c.num_key_value_heads, c.head_dim)
        v = v.reshape(b, t, c.num_key_value_heads, c.head_dim)
        q, k = f.qk_norm_rope(q, k, attn.q_norm.weight, attn.k_norm.weight, c.rms_norm_eps, cos, sin)
        attended = attend(q, k, v)
    x, h = f.add_rms_norm(x, attended, layer.post_attention_layernorm.weight, c.rms_norm_eps)
    if merged is None:
        gated = f.silu_mul(mlp.gate_proj(h), mlp.up_proj(h))
    else:
        gated = f.silu_mul_merged(F.linear(h, merged.gate_up))
    delta = mlp.down_proj(gated)
    return f.add_rms_norm(x, delta, next_norm, c.rms_norm_eps)


def walk(backbone: Qwen3Backbone, f: Fusions, embeds: torch.Tensor, positions: torch.Tensor,
         attend: AttendFn, attend_qkv: AttendQkvFn | None = None) -> torch.Tensor:
    """embeds [B, T, H] at positions [B, T] -> final-normed hidden states [B, T, H]."""
    cfg, layers = backbone.cfg, backbone.layers
    merged = getattr(backbone, "_engine_merged", None) or [None] * len(layers)
    cos, sin = neox_rope(positions, cfg.head_dim, cfg.rope_theta, embeds.dtype)
    x, h = embeds, f.rms_norm(embeds, layers[0].input_layernorm.weight, cfg.rms_norm_eps)
    for i, layer in enumerate(layers):
        next_norm = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else backbone.norm.weight
        x, h = _layer(layer, x, h, cos, sin, lambda q, k, v, i=i: attend(i, q, k, v), f, next_norm,
                      merged[i], attend_qkv and (lambda qkv, cos, sin, i=i: attend_qkv(i, qkv, cos, sin)))
    return h


def decode(backbone: Qwen3Backbone, f: Fusions, cache: StaticKVCache, embeds: torch.Tensor,
           slot_ids: torch.Tensor, positions: torch.Tensor, kv_len: int,
           use_kernel: bool = False, qkv_kernel: bool = False) -> torch.Tensor:
    """Slots [0, S), one fed-back row each at its own position: embeds [S, 1, H] -> hidden [S, H].

    Each slot attends to its rows [0, position] inside the window [0, kv_len); rows of a slot
    that is not generating are computed and ignored. use_kernel: the flash-decoding kernel,
    which reads only each slot's own rows (the runner decides once whether it can run here);
    else the masked SDPA below. qkv_kernel: each layer's q/k norms, RoPE and cache write in one
    Triton kernel (step_qkv.decode_qkv; slot s is row s, as slot_ids holds).
    """
    num_slots = embeds.shape[0]
    if use_kernel:
        lengths = positions + 1
    else:
        key_valid = torch.arange(kv_len, device=embeds.device).unsqueeze(0) <= positions.unsqueeze(1)
        bias = attention_bias(key_valid, 1, embeds.dtype)  # [S, 1, 1, kv_len]

    def attend(i: int, q, k, v):
        cache.write_step(i, slot_ids, positions, k[:, 0], v[:, 0])
        return attend_cache(i, q)

    def attend_qkv(i: int, qkv, cos, sin):
        attn = backbone.layers[i].self_attn
        c = attn.cfg
        q = step_qkv.decode_qkv(qkv, attn.q_norm.weight, attn.k_norm.weight, c.rms_norm_eps, cos, sin, cache.k[i],
                                cache.v[i], positions, c.num_attention_heads, c.num_key_value_heads, cache.scales(i))
        return attend_cache(i, q)

    def attend_cache(i: int, q):
        """q [S, 1, heads, d] over the slots' cached rows (this step's already written)."""
        attn = backbone.layers[i].self_attn
        if use_kernel:
            out = decode_attention.decode_attention(q[:, 0], cache.k[i], cache.v[i], lengths, kv_len,
                                                    kv_scales=cache.scales(i))
            return attn.o_proj(out.reshape(num_slots, 1, -1))
        keys, values = cache.window(i, num_slots, kv_len, q.dtype)
        kv_heads, head_dim = keys.shape[2], keys.shape[3]
        grouped = q.reshape(num_slots, kv_heads, -1, head_dim)  # heads kv*g .. kv*g+g-1 share kv head kv
        out = F.scaled_dot_product_attention(grouped, keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=bias)
        return attn.o_proj(out.reshape(num_slots, 1, -1))

    return walk(backbone, f, embeds, positions.unsqueeze(1), attend, attend_qkv if qkv_kernel else None)[:, 0]


def prefill(backbone: Qwen3Backbone, f: Fusions, cache: StaticKVCache, embeds: torch.Tensor,
            slots: torch.Tensor, lengths: torch.Tensor, use_kernel: bool = False) -> torch.Tensor:
    """Whole prompts from row 0, right-padded: embeds [N, T, H] -> each prompt's last hidden [N, H].

    Rows past a prompt's length are padding: their keys land in the slot past its length (stale
    rows that later steps mask or overwrite) and no valid query attends to them. use_kernel: each
    layer's q/k norms, RoPE and cache write, then its attention from the slots, by two Triton
    kernels (the runner decides once whether they can run here); else the compiled norms, index
    copies, the new rows' keys repeated per query head and a masked SDPA.
    """
    n, t = embeds.shape[:2]
    device = embeds.device
    positions = torch.arange(t, device=device).unsqueeze(0).expand(n, t)
    if use_kernel:
        return _prefill_in_slots(backbone, f, cache, embeds, slots, positions.contiguous(), torch.zeros_like(lengths),
                                 lengths, positions)
    bias = attention_bias(positions < lengths.unsqueeze(1), t, embeds.dtype)

    def attend(i: int, q, k, v):
        cache.write_prompts(i, slots, k, v)
        return backbone.layers[i].self_attn.attend(q, cache.as_stored(k), cache.as_stored(v), bias)

    hidden = walk(backbone, f, embeds, positions, attend)
    return hidden[torch.arange(n, device=device), lengths - 1]


def prefill_after(backbone: Qwen3Backbone, f: Fusions, cache: StaticKVCache, embeds: torch.Tensor,
                  slots: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, window: int,
                  use_kernel: bool = False) -> torch.Tensor:
    """Prompts whose rows [0, starts[n]) are already in their slots (copied from the prefix
    pool): embeds [N, T, H] are rows [starts[n], lengths[n]), right-padded -> last hidden [N, H].

    Keys come from the slots themselves, rows [0, window) with window >= every length. Padding
    rows write past a prompt's length (stale rows, as in `prefill`), clamped inside the slot.
    use_kernel: as in `prefill`, the slots read in place (window unused); else each prompt's window
    is gathered, repeated per query head and attended with a mask.
    """
    n, t = embeds.shape[:2]
    device = embeds.device
    positions = starts.unsqueeze(1) + torch.arange(t, device=device).unsqueeze(0)
    rows = positions.clamp(max=cache.max_seq_len - 1)
    if use_kernel:
        return _prefill_in_slots(backbone, f, cache, embeds, slots, rows, starts, lengths, positions)
    slot_rows = slots.unsqueeze(1).expand(n, t)
    allowed = torch.arange(window, device=device).view(1, 1, window) <= positions.unsqueeze(2)
    bias = torch.zeros(allowed.shape, device=device, dtype=embeds.dtype)
    bias = bias.masked_fill(~allowed, torch.finfo(embeds.dtype).min).unsqueeze(1)  # [N, 1, T, window]

    def attend(i: int, q, k, v):
        cache.write_step(i, slot_rows, rows, k, v)
        keys, values = cache.gather(i, slots, window, q.dtype)
        return backbone.layers[i].self_attn.attend(q, keys, values, bias)

    hidden = walk(backbone, f, embeds, positions, attend)
    return hidden[torch.arange(n, device=device), lengths - starts - 1]


def _prefill_in_slots(backbone: Qwen3Backbone, f: Fusions, cache: StaticKVCache, embeds: torch.Tensor,
                      slots: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:
    """A prefill whose layers write and read the slots in place: step_qkv.prefill_qkv (q/k norms,
    RoPE, each token's key and value at rows[n, t] of slot slots[n]), then prefill_attention (the
    query at positions[n, t] = starts[n] + t over rows [0, position] of its slot). Why: gathering each
    prompt's window, repeating it per query head and a masked SDPA took ~17% of the engine stream's
    GPU time under the H200's mixed soak (issue 34, round 13). -> each prompt's last hidden [N, H]."""
    n, t = embeds.shape[:2]

    def attend_qkv(i: int, qkv, cos, sin):
        attn = backbone.layers[i].self_attn
        c = attn.cfg
        q = step_qkv.prefill_qkv(qkv, attn.q_norm.weight, attn.k_norm.weight, c.rms_norm_eps, cos, sin, cache.k[i],
                                 cache.v[i], slots, rows, c.num_attention_heads, c.num_key_value_heads, cache.scales(i))
        out = prefill_attention.prefill_attention(q, cache.k[i], cache.v[i], slots, starts, lengths,
                                                  kv_scales=cache.scales(i))
        return attn.o_proj(out.reshape(n, t, -1))

    def attend(i: int, q, k, v):  # a backbone without merged projections (never the engine's)
        raise RuntimeError("the prefill kernels need the merged q/k/v projection (backbone.merge_projections)")

    hidden = walk(backbone, f, embeds, positions, attend, attend_qkv)
    return hidden[torch.arange(n, device=embeds.device), lengths - starts - 1]


def prefill_chunk(backbone: Qwen3Backbone, f: Fusions, cache: StaticKVCache, slot: int,
                  embeds: torch.Tensor, start: int) -> torch.Tensor:
    """Rows [start, start+T) of one long prompt: embeds [1, T, H] -> last hidden [1, H]."""
    t, device = embeds.shape[1], embeds.device
    positions = torch.arange(start, start + t, device=device).unsqueeze(0)
    bias = attention_bias(torch.ones(1, start + t, dtype=torch.bool, device=device), t, embeds.dtype)

    def attend(i: int, q, k, v):
        keys, values = cache.write_range(i, slot, start, k, v)
        return backbone.layers[i].self_attn.attend(q, keys, values, bias)

    return walk(backbone, f, embeds, positions, attend)[:, -1]
