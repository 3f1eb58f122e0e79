"""Flash-decoding attention for a decode step: one query row per slot over that slot's cache rows.

The masked SDPA over the padded window [0, kv_len) reads every row of the bucket; here each
program reads only rows [0, lengths[s]) of its slot. Split-K: grid (S, kv_heads, num_splits),
each program holds the `groups` query heads of one KV head (padded to 16 rows for tl.dot) and
keeps an fp32 online softmax over its share of the keys; a second small kernel merges the
splits' partials by log-sum-exp. Splits let a small batch still fill the GPU.

The grid and every allocation depend only on Python ints (S, the window bucket, shapes), and
nothing is read back to the host, so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kv_format import from_cache, is_fp8, scale_args
from .triton_setup import INTERPRET, LOG2E, jit, tl, triton

MIN_BLOCK_G = 16  # tl.dot needs M >= 16, so a KV head's query heads are padded to this
DEFAULT_NUM_SMS = 132  # H100/H200; used where no CUDA device can be asked (interpreter)
COMBINE_WARPS = 4  # the split combine's launch (not in DecodeConfig: the sweep left it as it was)


@dataclass(frozen=True)
class DecodeConfig:
    """The kernel's launch shape. block_n: keys per inner-loop tile (split lengths are multiples
    of it); programs_per_sm: split programs per SM to aim for (an H200 sweep found 3-4 best at
    S=16); num_warps, num_stages: Triton's. heads_first: program ids walk one slot's KV heads before
    the next slot, so programs launched together read neighbouring 256-byte pieces of the same
    cache rows (a row holds every KV head of a slot, 2 KB at the backbone's shape) instead of one
    piece each of eight slots' rows. Served since round 22: on an H100 the kernel took 0.8-2.2%
    less at 256 slots (level at 128 in the served mix) and the engine's step at 256 9.50/9.51 ms
    against 9.58/9.59; the output is the same bit for bit (perf/RESULTS.md, issue 34).
    fp16_dots: with an fp8 or int8 cache only, the key and value tiles widen to fp16 (fp8: one
    conversion an element pair; bf16 takes three) and q and the softmax weights are cast to fp16 for
    the two dots; the accumulation stays fp32. int8 widens exactly either way (|q| <= 127). fp16's
    range holds them: q is RMS-normed (|q| ~ sqrt(head_dim) x the q_norm weight), the weights lie in
    [0, 1] (int8: times a value's scale, its head's max |v| / 127), fp8's values within +-448.
    perf/bench_decode_attention.py sweeps them."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    programs_per_sm: int = 3
    heads_first: bool = True
    fp16_dots: bool = False

    def __post_init__(self):
        if self.block_n < 16 or self.block_n & (self.block_n - 1) or self.num_warps < 1 or self.num_stages < 1 \
                or self.programs_per_sm < 1:
            raise ValueError(f"DecodeConfig: block_n a power of two >= 16, the rest >= 1; got {self}")


DEFAULT_CONFIG = DecodeConfig()
# For an fp8 cache (kernels/kv_format.py): the sweep's best on an H100 at 256 slots (perf/
# bench_decode_attention.py --kv-cache-dtype fp8_e4m3, issue 34 round 25): 51.5 µs a call on
# bench_engine's lengths, against 66.1 with DEFAULT_CONFIG's tile on fp8 and 79.8 on a bf16 cache.
# A third pipeline stage hides the narrower loads; fp16 dots save two of three conversions.
FP8_CONFIG = DecodeConfig(num_stages=3, fp16_dots=True)
# For an int8 cache: fp8's third pipeline stage, with the dots in q's dtype (bf16 served): Triton
# widens int8 to bf16 with byte permutes and one bf16x2 subtract per pair (sm_90 PTX,
# tests/test_kernel_compile.py), but to fp16 with one cvt an element. The best of an H100 sweep at
# 256 slots (issue 34 round 26): 66.2 µs a call, against 73.5 with fp16 dots, 72.2 with two stages
# and 82.1 for the exact cache (fp8: 52.3).
INT8_CONFIG = DecodeConfig(num_stages=3)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                     max_len: int, scale: float | None = None, num_splits: int | None = None,
                     config: DecodeConfig | None = None,
                     kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q [S, heads, d]; k_cache/v_cache [N >= S, max_seq_len, kv_heads, d] (slot-major, may be the
    whole per-layer cache; slot s = row s; q's dtype, fp8 or int8, kv_format; an int8 cache's
    (k_scale, v_scale) [N, max_seq_len, kv_heads] in kv_scales); lengths [S] int64 on the device:
    slot s attends to its rows [0, lengths[s]) (lengths >= 1); max_len (Python int) bounds every
    length (the caller's window bucket) and may pick the split count. Returns [S, heads, d] in q.dtype.
    Default scale 1/sqrt(d). num_splits forces the split count (tests); None picks it from S and max_len.
    config: the kernel's launch shape; None reads DEFAULT_CONFIG (FP8_/INT8_CONFIG for those caches) at the
    call, not at import, so a benchmark can A/B a whole engine step by setting it (perf/bench_engine.py
    --decode-order, --decode-config).
    """
    if not is_supported(q, k_cache):
        return reference_attention(q, k_cache, v_cache, lengths, max_len, scale, kv_scales)
    config = config or (INT8_CONFIG if kv_scales is not None else FP8_CONFIG if is_fp8(k_cache.dtype)
                        else DEFAULT_CONFIG)
    return _triton_attention(q, k_cache, v_cache, lengths, max_len, scale, num_splits, config, kv_scales)


def is_supported(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """True when the Triton kernel can run here: triton importable, tensors on CUDA (or
    TRITON_INTERPRET=1 is set, for CPU tests), head_dim a power of two, heads % kv_heads == 0."""
    if triton is None or not (INTERPRET or (q.is_cuda and k_cache.is_cuda)):
        return False
    head_dim, heads, kv_heads = q.shape[-1], q.shape[-2], k_cache.shape[2]
    is_pow2 = head_dim >= 16 and head_dim & (head_dim - 1) == 0  # tl.dot needs K >= 16
    return is_pow2 and heads % kv_heads == 0 and q.dtype in (torch.float16, torch.bfloat16, torch.float32)


def reference_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                        max_len: int, scale: float | None = None,
                        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Same contract in plain torch (masked SDPA over the window [0, max_len)); the fallback and the tests' oracle."""
    num_slots, heads, head_dim = q.shape
    k_scale, v_scale = (s[:num_slots, :max_len] for s in kv_scales) if kv_scales is not None else (None, None)
    keys = from_cache(k_cache[:num_slots, :max_len], q.dtype, k_scale).transpose(1, 2)  # [S, kv_heads, max_len, d]
    values = from_cache(v_cache[:num_slots, :max_len], q.dtype, v_scale).transpose(1, 2)
    grouped = q.reshape(num_slots, keys.shape[1], -1, head_dim)  # heads kv*g .. kv*g+g-1 share kv head kv
    valid = torch.arange(max_len, device=q.device) < lengths.unsqueeze(1)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=valid[:, None, None, :], scale=scale)
    return out.reshape(num_slots, heads, head_dim)


def split_plan(num_slots: int, kv_heads: int, max_len: int, num_sms: int = DEFAULT_NUM_SMS,
               num_splits: int | None = None, config: DecodeConfig | None = None) -> tuple[int, int]:
    """(num_splits, split_len): enough splits that S * kv_heads * num_splits >= programs_per_sm * num_sms,
    at most one per block_n tile of the window, each a whole number of tiles. config None: DEFAULT_CONFIG
    at the call, as decode_attention reads it."""
    config = config or DEFAULT_CONFIG
    block_n = config.block_n
    num_blocks = _cdiv(max_len, block_n)
    if num_splits is None:
        wanted = _cdiv(config.programs_per_sm * num_sms, num_slots * kv_heads)
        num_splits = max(1, min(wanted, num_blocks))
        split_len = _cdiv(num_blocks, num_splits) * block_n
        return _cdiv(max_len, split_len), split_len  # rounding may leave the last splits empty: drop them
    return num_splits, _cdiv(num_blocks, num_splits) * block_n


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _triton_attention(q, k_cache, v_cache, lengths, max_len, scale, num_splits, config, kv_scales):
    num_slots, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    groups = heads // kv_heads
    num_splits, split_len = split_plan(num_slots, kv_heads, max_len, _num_sms(q.device), num_splits, config)
    qk_scale = (scale if scale is not None else 1.0 / math.sqrt(head_dim)) * LOG2E  # softmax in exp2
    out = torch.empty(num_slots, heads, head_dim, dtype=q.dtype, device=q.device)
    parts = num_splits if num_splits > 1 else 0  # one split writes the output directly: no partials
    part_acc = q.new_empty(num_slots, heads, parts, head_dim, dtype=torch.float32)
    part_max = q.new_empty(num_slots, heads, parts, dtype=torch.float32)
    part_sum = q.new_empty(num_slots, heads, parts, dtype=torch.float32)
    grid = (kv_heads, num_slots, num_splits) if config.heads_first else (num_slots, kv_heads, num_splits)
    _split_kernel[grid](
        q, k_cache, v_cache, *scale_args(k_cache, kv_scales), lengths, out, part_acc, part_max, part_sum,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        max_len, split_len, heads, num_splits, qk_scale,
        GROUPS=groups, BLOCK_G=max(MIN_BLOCK_G, triton.next_power_of_2(groups)), BLOCK_N=config.block_n,
        HEAD_DIM=head_dim, DIRECT=num_splits == 1, HEADS_FIRST=config.heads_first,
        FP16_DOTS=config.fp16_dots and q.dtype != k_cache.dtype, SCALED=kv_scales is not None,
        num_warps=config.num_warps,
        num_stages=config.num_stages)
    if num_splits > 1:
        _combine_kernel[(num_slots, heads)](
            part_acc, part_max, part_sum, out, *out.stride(), heads, num_splits,
            HEAD_DIM=head_dim, BLOCK_SPLITS=triton.next_power_of_2(num_splits), num_warps=COMBINE_WARPS)
    return out


@jit
def _split_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_ss, stride_st, lengths_ptr, out_ptr, acc_ptr,
                  max_ptr, sum_ptr,
                  stride_qs, stride_qh, stride_qd,
                  stride_kn, stride_kt, stride_kh, stride_kd,
                  stride_vn, stride_vt, stride_vh, stride_vd,
                  stride_os, stride_oh, stride_od,
                  max_len, split_len, num_heads, num_splits, qk_scale,
                  GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_DIM: tl.constexpr, DIRECT: tl.constexpr, HEADS_FIRST: tl.constexpr,
                  FP16_DOTS: tl.constexpr, SCALED: tl.constexpr):
    """One (slot, kv head, split): online softmax over keys [split*split_len, min(length, next split))."""
    if HEADS_FIRST:  # DecodeConfig.heads_first: the grid is (kv_heads, S, splits)
        slot = tl.program_id(1).to(tl.int64)
        kv_head = tl.program_id(0)
    else:
        slot = tl.program_id(0).to(tl.int64)  # slot * stride_kn passes 2**31 in a full-size cache
        kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # clamped so a stale length can never read past the window the caller sized
    length = tl.minimum(tl.load(lengths_ptr + slot), max_len).to(tl.int32)
    start = split * split_len
    end = tl.minimum(length, start + split_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    is_head = offs_g < GROUPS
    heads = kv_head * GROUPS + offs_g
    q = tl.load(q_ptr + slot * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=is_head[:, None], other=0.0)
    if FP16_DOTS:  # DecodeConfig.fp16_dots: the tiles below widen to q's dtype
        q = q.to(tl.float16)
    k_base = k_ptr + slot * stride_kn + kv_head * stride_kh
    v_base = v_ptr + slot * stride_vn + kv_head * stride_vh
    scale_at = slot * stride_ss + kv_head  # an int8 cache's scales of this KV head (SCALED)

    # a split past the slot's length skips the loop and leaves the empty partial (-inf, 0, 0)
    row_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for first in range(start, end, BLOCK_N):
        rows = first + offs_n
        is_key = rows < end
        # rows past the length are never loaded, so stale cache contents cannot reach the result
        # an fp8 or int8 cache (kv_format) widens to q's dtype here: the tensor cores see what they saw
        k = tl.load(k_base + rows[None, :] * stride_kt + offs_d[:, None] * stride_kd,
                    mask=is_key[None, :], other=0.0).to(q.dtype)
        scores = tl.dot(q, k, input_precision="ieee") * qk_scale  # "ieee": no tf32 for fp32 inputs
        if SCALED:  # a key's scale multiplies its scores (q . (s k) = s (q . k))
            scores *= tl.load(ks_ptr + scale_at + rows * stride_st, mask=is_key, other=0.0)[None, :]
        scores = tl.where(is_key[None, :], scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))  # finite: every tile holds a valid key
        alpha = tl.exp2(row_max - new_max)
        p = tl.exp2(scores - new_max[:, None])
        v = tl.load(v_base + rows[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                    mask=is_key[:, None], other=0.0).to(q.dtype)
        if SCALED:  # a value's scale multiplies its weights (p (s v) = (p s) v); the sum keeps p's
            pv = p * tl.load(vs_ptr + scale_at + rows * stride_st, mask=is_key, other=0.0)[None, :]
        else:
            pv = p
        acc = acc * alpha[:, None] + tl.dot(pv.to(v.dtype), v, input_precision="ieee")
        row_sum = row_sum * alpha + tl.sum(p, 1)
        row_max = new_max

    if DIRECT:
        out = acc / row_sum[:, None]
        tl.store(out_ptr + slot * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=is_head[:, None])
    else:
        part = (slot * num_heads + heads) * num_splits + split
        tl.store(acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=is_head[:, None])
        tl.store(max_ptr + part, row_max, mask=is_head)
        tl.store(sum_ptr + part, row_sum, mask=is_head)


@jit
def _combine_kernel(acc_ptr, max_ptr, sum_ptr, out_ptr, stride_os, stride_oh, stride_od, num_heads, num_splits,
                    HEAD_DIM: tl.constexpr, BLOCK_SPLITS: tl.constexpr):
    """One (slot, head): log-sum-exp merge of its splits' partials."""
    slot = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    first = (slot * num_heads + head) * num_splits
    offs_s = tl.arange(0, BLOCK_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    is_split = offs_s < num_splits
    maxes = tl.load(max_ptr + first + offs_s, mask=is_split, other=float("-inf"))
    global_max = tl.max(maxes, 0)  # finite: split 0 holds key 0 of every slot (lengths >= 1)
    weights = tl.exp2(maxes - global_max)  # empty splits (max -inf) weigh exactly 0
    total = tl.sum(tl.load(sum_ptr + first + offs_s, mask=is_split, other=0.0) * weights, 0)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    # one split row at a time keeps registers at HEAD_DIM instead of BLOCK_SPLITS * HEAD_DIM
    for i in range(num_splits):
        weight = tl.exp2(tl.load(max_ptr + first + i) - global_max)
        acc += tl.load(acc_ptr + (first + i) * HEAD_DIM + offs_d) * weight
    tl.store(out_ptr + slot * stride_os + head * stride_oh + offs_d * stride_od,
             (acc / total).to(out_ptr.dtype.element_ty))
