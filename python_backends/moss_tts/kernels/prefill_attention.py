"""Prefill attention straight from the slots: N prompts' new query rows, each at its own
positions, over the keys of the prompt's own slot, read where they lie in the cache.

Why: a batched prefill used to gather each prompt's whole key window out of the cache
(`index_select`), repeat it for every query head (GQA: 4x the bytes), build an additive mask and
run SDPA with it (PyTorch's sm80 memory-efficient kernel; flash takes no mask). Under the H200's
mixed soak those copies and that attention took ~17% of the engine stream's GPU time, with the GPU
busy 99% of the time (issue 34, round 13's trace). Here one program holds BLOCK_T query rows times
the query heads of one KV head (the group in the tile's rows, so each key tile is loaded once for
all of them) and walks its slot's keys with an online softmax: the tiles that every row of the
block sees whole run without a mask, the rest with a causal one.

The grid and allocations depend only on Python ints (N, T, shapes) and nothing is read back to
the host, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kv_format import from_cache, scale_args
from .triton_setup import INTERPRET, LOG2E, jit, tl, triton


@dataclass(frozen=True)
class PrefillConfig:
    """The kernel's launch shape: block_t query rows (times the group's heads, padded to a power
    of two) per program, block_n keys per inner-loop tile, Triton's warps and stages. The default is
    the fastest of 6 shapes on the H200 in all 4 of perf/bench_prefill_attention.py's prefills (10-18%
    ahead of 64-key tiles; issue 34, round 13's call 2)."""

    block_t: int = 16
    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_t", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"PrefillConfig.{name} must be a power of two >= 16 (tl.dot), not {value}")
        if self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"PrefillConfig: num_warps and num_stages must be >= 1, not {self}")


DEFAULT_CONFIG = PrefillConfig()


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                      starts: torch.Tensor, lengths: torch.Tensor, scale: float | None = None,
                      config: PrefillConfig = DEFAULT_CONFIG,
                      kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q [N, T, heads, d]: row t of prompt n is at position starts[n] + t. k_cache/v_cache
    [num_slots, rows, kv_heads, d] (q's dtype, fp8 or int8, kv_format; an int8 cache's (k_scale,
    v_scale) [num_slots, rows, kv_heads] in kv_scales) hold prompt n's keys/values in slot slots[n], rows [0,
    lengths[n]) (this launch's rows already written). Row t attends to rows [0, min(starts[n] + t,
    lengths[n] - 1)]: rows at or past lengths[n] - starts[n] are padding and see the whole prompt
    (finite, for the caller to ignore). lengths >= 1. Returns [N, T, heads, d] in q.dtype."""
    if not is_supported(q, k_cache):
        return reference_prefill_attention(q, k_cache, v_cache, slots, starts, lengths, scale, kv_scales)
    return _triton_prefill(q, k_cache, v_cache, slots, starts, lengths, scale, config, kv_scales)


def is_supported(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """True when the Triton kernel can run here: triton importable, tensors on CUDA (or
    TRITON_INTERPRET=1, for CPU tests), head_dim a power of two >= 16 and contiguous in q and the
    cache (the kernel adds it unstrided), heads % kv_heads == 0."""
    if triton is None or not (INTERPRET or (q.is_cuda and k_cache.is_cuda)):
        return False
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1:
        return False
    head_dim, heads, kv_heads = q.shape[-1], q.shape[-2], k_cache.shape[2]
    is_pow2 = head_dim >= 16 and head_dim & (head_dim - 1) == 0
    return is_pow2 and heads % kv_heads == 0 and q.dtype in (torch.float16, torch.bfloat16, torch.float32)


def reference_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                                starts: torch.Tensor, lengths: torch.Tensor, scale: float | None = None,
                                kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The same contract in plain torch (gather, GQA repeat, masked SDPA): the fallback and the
    tests' oracle. Reads the lengths back to size the window (a host sync)."""
    n, t, heads, head_dim = q.shape
    window = min(int(lengths.max()), k_cache.shape[1])
    groups = heads // k_cache.shape[2]
    k_scale, v_scale = ((s.index_select(0, slots)[:, :window] for s in kv_scales) if kv_scales is not None
                        else (None, None))
    keys = from_cache(k_cache.index_select(0, slots)[:, :window], q.dtype, k_scale).repeat_interleave(groups, dim=2)
    values = from_cache(v_cache.index_select(0, slots)[:, :window], q.dtype, v_scale).repeat_interleave(groups, dim=2)
    newest = torch.minimum(starts.unsqueeze(1) + torch.arange(t, device=q.device), lengths.unsqueeze(1) - 1)
    seen = torch.arange(window, device=q.device).view(1, 1, window) <= newest.unsqueeze(2)  # [N, T, W]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=seen.unsqueeze(1), scale=scale)
    return out.transpose(1, 2)


def _triton_prefill(q, k_cache, v_cache, slots, starts, lengths, scale, config: PrefillConfig, kv_scales):
    n, t, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    groups = heads // kv_heads
    assert v_cache.stride(-1) == 1 and v_cache.shape == k_cache.shape, "values must be laid out as the keys"
    qk_scale = (scale if scale is not None else 1.0 / math.sqrt(head_dim)) * LOG2E  # softmax in exp2
    out = torch.empty_like(q)
    _prefill_kernel[(-(-t // config.block_t), n, kv_heads)](
        q, k_cache, v_cache, *scale_args(k_cache, kv_scales), slots, starts, lengths, out,
        *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3], *out.stride()[:3],
        t, k_cache.shape[1], qk_scale,
        GROUPS=groups, BLOCK_G=triton.next_power_of_2(groups), BLOCK_T=config.block_t, BLOCK_N=config.block_n,
        HEAD_DIM=head_dim, SCALED=kv_scales is not None, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


@jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_ss, stride_st, slots_ptr, starts_ptr, lengths_ptr,
                    out_ptr,
                    stride_qn, stride_qt, stride_qh, stride_kn, stride_kt, stride_kh,
                    stride_vn, stride_vt, stride_vh, stride_on, stride_ot, stride_oh,
                    T, max_rows, qk_scale,
                    GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                    HEAD_DIM: tl.constexpr, SCALED: tl.constexpr):
    """One (block of query rows, prompt, kv head). Tile row m is query row first_t + m // BLOCK_G,
    head kv_head * GROUPS + m % BLOCK_G (group members past GROUPS are padding)."""
    first_t = tl.program_id(0) * BLOCK_T
    n = tl.program_id(1).to(tl.int64)
    kv_head = tl.program_id(2)
    slot = tl.load(slots_ptr + n).to(tl.int64)
    start = tl.load(starts_ptr + n).to(tl.int32)
    length = tl.minimum(tl.load(lengths_ptr + n), max_rows).to(tl.int32)  # never past the cache's rows

    offs_m = tl.arange(0, BLOCK_T * BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row = first_t + offs_m // BLOCK_G
    head = kv_head * GROUPS + offs_m % BLOCK_G
    is_query = (row < T) & (offs_m % BLOCK_G < GROUPS)
    q = tl.load(q_ptr + n * stride_qn + row.to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
                + offs_d[None, :], mask=is_query[:, None], other=0.0)
    newest = tl.minimum(start + row, length - 1)  # [M]: the newest key each row sees
    # Keys [0, full) every row of the block sees; [full, hi) the causal edge (hi: the newest any row sees + 1).
    full = tl.minimum(start + first_t + 1, length)
    hi = tl.minimum(start + first_t + BLOCK_T, length)
    # A block of padding rows only (a short prompt padded to the launch's rows) reads key 0 alone:
    # its output is unused but must stay finite (it reaches stale cache rows), and reading the whole
    # prompt for it would multiply a reused prefix's reads by the padding blocks.
    is_padding = start + first_t >= length
    full = tl.where(is_padding, 0, full)
    hi = tl.where(is_padding, 1, hi)
    # The slot's offset in int64 (slot x stride passes 2**31 in a full-size cache); a key's offset
    # inside its slot stays in int32 (rows x kv_heads x head_dim: ~2 M at 2,048 rows).
    k_base = k_ptr + slot * stride_kn + kv_head * stride_kh
    v_base = v_ptr + slot * stride_vn + kv_head * stride_vh
    ks_base = ks_ptr + slot * stride_ss + kv_head  # an int8 cache's scales of this KV head (SCALED)
    vs_base = vs_ptr + slot * stride_ss + kv_head

    row_max = tl.full([BLOCK_T * BLOCK_G], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_T * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_T * BLOCK_G, HEAD_DIM], tl.float32)
    num_full = full // BLOCK_N
    for k in range(0, num_full):  # seen whole: no mask
        row_max, row_sum, acc = _key_tile(q, k_base, v_base, ks_base, vs_base, k * BLOCK_N + offs_n, offs_d,
                                          stride_kt, stride_vt, stride_st, newest, hi, row_max, row_sum, acc,
                                          qk_scale, False, SCALED)
    for first in range(num_full * BLOCK_N, hi, BLOCK_N):  # the causal edge
        row_max, row_sum, acc = _key_tile(q, k_base, v_base, ks_base, vs_base, first + offs_n, offs_d,
                                          stride_kt, stride_vt, stride_st, newest, hi, row_max, row_sum, acc,
                                          qk_scale, True, SCALED)
    out = acc / row_sum[:, None]
    tl.store(out_ptr + n * stride_on + row.to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
             + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=is_query[:, None])


@jit
def _key_tile(q, k_base, v_base, ks_base, vs_base, keys, offs_d, stride_kt, stride_vt, stride_st, newest, hi,
              row_max, row_sum, acc, qk_scale, MASKED: tl.constexpr, SCALED: tl.constexpr):
    """Keys `keys` of the slot into the online softmax. MASKED: the causal edge (keys past `hi`
    not loaded, a row sees keys up to its `newest`); else every row sees every key of the tile.
    SCALED: an int8 cache, each key's scale on its scores and each value's on its weights."""
    if MASKED:
        is_key = keys < hi
        kt = tl.load(k_base + keys[None, :] * stride_kt + offs_d[:, None], mask=is_key[None, :],
                     other=0.0).to(q.dtype)  # an fp8 or int8 cache (kv_format) widens to q's dtype
        v = tl.load(v_base + keys[:, None] * stride_vt + offs_d[None, :], mask=is_key[:, None], other=0.0).to(q.dtype)
        scores = tl.dot(q, kt, input_precision="ieee") * qk_scale  # "ieee": no tf32 for fp32 inputs
        if SCALED:
            scores *= tl.load(ks_base + keys * stride_st, mask=is_key, other=0.0)[None, :]
        # Finite maxima: key 0 is in the first tile walked and every row sees it (newest >= 0).
        scores = tl.where(keys[None, :] <= newest[:, None], scores, float("-inf"))
    else:
        kt = tl.load(k_base + keys[None, :] * stride_kt + offs_d[:, None]).to(q.dtype)
        v = tl.load(v_base + keys[:, None] * stride_vt + offs_d[None, :]).to(q.dtype)
        scores = tl.dot(q, kt, input_precision="ieee") * qk_scale
        if SCALED:
            scores *= tl.load(ks_base + keys * stride_st)[None, :]
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    alpha = tl.exp2(row_max - new_max)
    p = tl.exp2(scores - new_max[:, None])
    if SCALED:  # a value's scale on its weights (masked keys' weights are 0 already); the sum keeps p's
        pv = p * tl.load(vs_base + keys * stride_st, mask=keys < hi, other=0.0)[None, :]
    else:
        pv = p
    acc = acc * alpha[:, None] + tl.dot(pv.to(v.dtype), v, input_precision="ieee")
    return new_max, row_sum * alpha + tl.sum(p, 1), acc
