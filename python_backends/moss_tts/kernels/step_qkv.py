"""What a decode step does between a layer's qkv GEMM and its attention, as one Triton kernel.

decode_qkv (the Qwen3 backbone): RMSNorm of each q and k head, NeoX RoPE, and the new key and
value written straight into the slot-major cache at each slot's position (as kv_format stores
them: an int8 cache's scales too, kv_scales); returns the rotated q. It replaces, per layer, the
compiled norm+RoPE kernel and the cache write's two index_put kernels (36 layers: 108 kernels a
step become 36). prefill_qkv is the same for a batched prefill's N x T tokens, each into its
prompt's slot at its own row (engine knob prefill_kernel).

local_attention_step (the local transformer, one of a frame's 12 micro-steps): interleaved RoPE
of q and k, the new key and value into the frame's local cache at `pos`, and attention of the
one query over local positions [0, pos]. It replaces the compiled RoPE kernel, two cache copies
and the two-kernel attention reduction (60 kernels a frame become 12).

At batch 256 each of those kernels moves a few hundred KB; the H200 profile showed them costing
their launch and ramp, not their bytes, so fewer of them is the gain. The math is that of the
torch references below (the CPU path and the tests' oracle): norms, rotations and softmax in
fp32, rounded to the activations' dtype where the modules round explicitly. Grids depend on
shapes only and nothing is read back to the host: capturable.
"""

from __future__ import annotations

import torch

from .fused import local_attention_reduced, local_qkv_rope, qk_norm_rope
from .kv_format import cache_value, quantize_heads, scale_args, split_rows, to_rows
from .triton_setup import INTERPRET, jit, tl, triton

NUM_WARPS = 4
LOCAL_BLOCK_H = 8  # local heads per program: 4 programs per row at 32 heads


def is_supported(x: torch.Tensor) -> bool:
    """True where the kernels can run: triton importable, x on CUDA (or TRITON_INTERPRET=1)."""
    return triton is not None and (INTERPRET or x.is_cuda) and x.dtype in (torch.float16, torch.bfloat16,
                                                                            torch.float32)


def fits_decode(head_dim: int) -> bool:
    """decode_qkv loads each head as two halves of a power-of-two width (the NeoX pairs)."""
    half = head_dim // 2
    return head_dim % 2 == 0 and half >= 1 and half & (half - 1) == 0


# ------------------------------------------------------------------------------------ backbone
def decode_qkv(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
               cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               positions: torch.Tensor, heads: int, kv_heads: int,
               kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """qkv [S, 1, (heads + 2 kv_heads) x d] (the merged projection's output, q heads then k then v);
    cos/sin [S, 1, 1, d] (neox_rope); caches [N >= S, rows, kv_heads, d], slot s = row s; kv_scales an
    int8 cache's (k_scale, v_scale) [N, rows, kv_heads], else None; positions [S] long. Writes slot
    s's normed, rotated key and its value at row positions[s] and returns q [S, 1, heads, d], normed
    and rotated. Unchecked, as the scheduler guarantees them: slot s is cache row s (backbone.decode's
    slot_ids is an arange) and positions lie inside the rows (a kernel cannot raise; an index_put
    would). Where the kernel cannot run, the torch reference runs eagerly (the runner only enables
    the kernel where fits_decode holds)."""
    if not (is_supported(qkv) and fits_decode(q_weight.shape[0])):
        return reference_decode_qkv(qkv, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, positions,
                                    heads, kv_heads, kv_scales)
    num_slots, head_dim = qkv.shape[0], q_weight.shape[0]
    flat = qkv.reshape(num_slots, -1)
    cos2, sin2 = cos.reshape(num_slots, head_dim), sin.reshape(num_slots, head_dim)
    q = torch.empty(num_slots, 1, heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    assert flat.stride(1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    assert cos2.stride(1) == sin2.stride(1) == 1 and positions.stride(0) == 1
    _decode_qkv_kernel[(num_slots, 2)](
        flat, q_weight, k_weight, cos2, sin2, positions, q, k_cache, v_cache, *scale_args(k_cache, kv_scales), eps,
        flat.stride(0), cos2.stride(0), sin2.stride(0), q.stride(0), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HEADS=heads, KV_HEADS=kv_heads, BLOCK_H=triton.next_power_of_2(max(heads, kv_heads)), HALF=head_dim // 2,
        num_warps=NUM_WARPS)
    return q


def reference_decode_qkv(qkv, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, positions, heads, kv_heads, kv_scales=None):
    """The same in torch (backbone._layer + StaticKVCache.write_step): the prefill's, a token a slot."""
    slots = torch.arange(qkv.shape[0], device=qkv.device)
    return reference_prefill_qkv(qkv, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, slots,
                                 positions.unsqueeze(1), heads, kv_heads, kv_scales)


def prefill_qkv(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slots: torch.Tensor, rows: torch.Tensor, heads: int, kv_heads: int,
                kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """decode_qkv for a batched prefill: qkv [N, T, (heads + 2 kv_heads) x d]; cos/sin [N, T, 1, d];
    token t of prompt n written to slot slots[n] at row rows[n, t] (long [N, T], inside the slots'
    rows). Returns q [N, T, heads, d], normed and rotated. One kernel a layer instead of the compiled
    norm+RoPE kernel and two index_put kernels (backbone.prefill / prefill_after, with prefill_kernel)."""
    if not (is_supported(qkv) and fits_decode(q_weight.shape[0])):
        return reference_prefill_qkv(qkv, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, slots, rows,
                                     heads, kv_heads, kv_scales)
    (n, t, _), head_dim = qkv.shape, q_weight.shape[0]
    flat = qkv.reshape(n * t, -1)
    cos2, sin2, positions = cos.reshape(n * t, head_dim), sin.reshape(n * t, head_dim), rows.reshape(n * t)
    q = torch.empty(n, t, heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    assert flat.stride(1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    assert cos2.stride(1) == sin2.stride(1) == 1 and positions.stride(0) == 1 and slots.stride(0) == 1
    _prefill_qkv_kernel[(n * t, 2)](
        flat, q_weight, k_weight, cos2, sin2, positions, slots, q, k_cache, v_cache, *scale_args(k_cache, kv_scales),
        eps, t, flat.stride(0), cos2.stride(0), sin2.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        HEADS=heads, KV_HEADS=kv_heads, BLOCK_H=triton.next_power_of_2(max(heads, kv_heads)), HALF=head_dim // 2,
        num_warps=NUM_WARPS)
    return q


def reference_prefill_qkv(qkv, q_weight, k_weight, eps, cos, sin, k_cache, v_cache, slots, rows, heads, kv_heads,
                          kv_scales=None):
    """The same in torch, as backbone._layer's split path and StaticKVCache.write_step do it."""
    n, t, _ = qkv.shape
    head_dim = q_weight.shape[0]
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = qk_norm_rope(q.reshape(n, t, heads, head_dim), k.reshape(n, t, kv_heads, head_dim),
                        q_weight, k_weight, eps, cos, sin)
    slot_rows = slots.unsqueeze(1).expand(n, t)
    k_scale, v_scale = kv_scales or (None, None)
    for x, cache, scales in ((k, k_cache, k_scale), (v.reshape(n, t, kv_heads, head_dim), v_cache, v_scale)):
        values, row_scales = split_rows(to_rows(x, cache.dtype), kv_heads, head_dim)
        cache.index_put_((slot_rows, rows), values)
        if scales is not None:  # an int8 cache: each head's scale beside its values
            scales.index_put_((slot_rows, rows), row_scales)
    return q



@jit
def _norm_rope(x_ptr, w_ptr, cos_lo, cos_hi, sin_lo, sin_hi, rows, n_rows, eps,
               HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """Heads [BLOCK_H, 2 HALF] at x_ptr (head h at h x 2 HALF): RMSNorm with weight w (normalised
    in fp32, cast to x's dtype, then scaled: RMSNorm's order) and NeoX rotation -> fp32 halves."""
    offs_d = tl.arange(0, HALF)
    mask = (rows < n_rows)[:, None]
    tile = x_ptr + rows[:, None] * (2 * HALF) + offs_d[None, :]
    lo = tl.load(tile, mask=mask, other=0.0).to(tl.float32)
    hi = tl.load(tile + HALF, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(lo * lo, 1) + tl.sum(hi * hi, 1)) / (2 * HALF) + eps)
    dtype = x_ptr.dtype.element_ty
    w_lo = tl.load(w_ptr + offs_d).to(tl.float32)
    w_hi = tl.load(w_ptr + HALF + offs_d).to(tl.float32)
    lo = w_lo[None, :] * (lo * rstd[:, None]).to(dtype).to(tl.float32)
    hi = w_hi[None, :] * (hi * rstd[:, None]).to(dtype).to(tl.float32)
    return lo * cos_lo[None, :] - hi * sin_lo[None, :], hi * cos_hi[None, :] + lo * sin_hi[None, :]


@jit
def _decode_qkv_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                       ks_ptr, vs_ptr, stride_ss, stride_st,
                       eps, stride_qkv, stride_cos, stride_sin, stride_qs, stride_qh,
                       stride_cs, stride_ct, stride_ch,
                       HEADS: tl.constexpr, KV_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    """One (slot, part): part 0 the q heads into q, part 1 the k heads (normed, rotated) and the
    v heads into the caches at the slot's position."""
    s = tl.program_id(0).to(tl.int64)
    _qkv_token(s, s, pos_ptr, qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, k_cache_ptr, v_cache_ptr, ks_ptr,
               vs_ptr, stride_ss, stride_st, eps, stride_qkv, stride_cos, stride_sin, stride_qs, stride_qh, stride_cs,
               stride_ct, stride_ch, HEADS, KV_HEADS, BLOCK_H, HALF)


@jit
def _prefill_qkv_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slots_ptr, q_ptr, k_cache_ptr,
                        v_cache_ptr, ks_ptr, vs_ptr, stride_ss, stride_st, eps, tokens_per_slot, stride_qkv,
                        stride_cos, stride_sin, stride_qs, stride_qh, stride_cs, stride_ct, stride_ch,
                        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    """One (token, part) of N prompts' T tokens each, token s of prompt s // T into slot slots[s // T]
    at row pos[s]. A kernel of its own name: the GPU budget counts decode steps by the decode kernel."""
    s = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + s // tokens_per_slot).to(tl.int64)
    _qkv_token(s, slot, pos_ptr, qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, k_cache_ptr, v_cache_ptr, ks_ptr,
               vs_ptr, stride_ss, stride_st, eps, stride_qkv, stride_cos, stride_sin, stride_qs, stride_qh, stride_cs,
               stride_ct, stride_ch, HEADS, KV_HEADS, BLOCK_H, HALF)


@jit
def _qkv_token(s, slot, pos_ptr, qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, k_cache_ptr, v_cache_ptr, ks_ptr,
               vs_ptr, stride_ss, stride_st, eps, stride_qkv, stride_cos, stride_sin, stride_qs, stride_qh, stride_cs,
               stride_ct, stride_ch, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, BLOCK_H: tl.constexpr,
               HALF: tl.constexpr):
    """Token s's part tl.program_id(1): 0 its q heads into q row s, 1 its k heads (normed, rotated)
    and v heads into cache slot `slot` at row pos[s]."""
    rows = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HALF)
    cos_lo = tl.load(cos_ptr + s * stride_cos + offs_d).to(tl.float32)
    cos_hi = tl.load(cos_ptr + s * stride_cos + HALF + offs_d).to(tl.float32)
    sin_lo = tl.load(sin_ptr + s * stride_sin + offs_d).to(tl.float32)
    sin_hi = tl.load(sin_ptr + s * stride_sin + HALF + offs_d).to(tl.float32)
    row = qkv_ptr + s * stride_qkv
    dtype = q_ptr.dtype.element_ty
    if tl.program_id(1) == 0:
        lo, hi = _norm_rope(row, qw_ptr, cos_lo, cos_hi, sin_lo, sin_hi, rows, HEADS, eps, HALF, BLOCK_H)
        mask = (rows < HEADS)[:, None]
        out = q_ptr + s * stride_qs + rows[:, None] * stride_qh + offs_d[None, :]
        tl.store(out, lo.to(dtype), mask=mask)
        tl.store(out + HALF, hi.to(dtype), mask=mask)
    else:
        lo, hi = _norm_rope(row + HEADS * 2 * HALF, kw_ptr, cos_lo, cos_hi, sin_lo, sin_hi, rows, KV_HEADS, eps,
                            HALF, BLOCK_H)
        mask, pos = (rows < KV_HEADS)[:, None], tl.load(pos_ptr + s).to(tl.int64)
        at = slot * stride_cs + pos * stride_ct + rows[:, None] * stride_ch + offs_d[None, :]
        scale_at = slot * stride_ss + pos * stride_st + rows  # an int8 cache's scales (kv_format)
        # the key rounded to the model's dtype first, as the torch path's k is (kv_format.to_rows); new
        # names, as Triton types a name alike in both branches of the runtime `if` above
        k_lo, k_hi = lo.to(dtype), hi.to(dtype)
        if k_cache_ptr.dtype.element_ty.is_int8():  # each head's values and scale (kv_format.quantize_heads)
            k_lo, k_hi, k_scale = quantize_heads(k_lo.to(tl.float32), k_hi.to(tl.float32))
            tl.store(ks_ptr + scale_at, k_scale, mask=rows < KV_HEADS)
        tl.store(k_cache_ptr + at, cache_value(k_lo, k_cache_ptr), mask=mask)
        tl.store(k_cache_ptr + at + HALF, cache_value(k_hi, k_cache_ptr), mask=mask)
        v = row + (HEADS + KV_HEADS) * 2 * HALF + rows[:, None] * (2 * HALF) + offs_d[None, :]
        v_lo, v_hi = tl.load(v, mask=mask, other=0.0), tl.load(v + HALF, mask=mask, other=0.0)
        if v_cache_ptr.dtype.element_ty.is_int8():
            v_lo, v_hi, v_scale = quantize_heads(v_lo.to(tl.float32), v_hi.to(tl.float32))
            tl.store(vs_ptr + scale_at, v_scale, mask=rows < KV_HEADS)
        tl.store(v_cache_ptr + at, cache_value(v_lo, v_cache_ptr), mask=mask)
        tl.store(v_cache_ptr + at + HALF, cache_value(v_hi, v_cache_ptr), mask=mask)


# ------------------------------------------------------------------------------------ local frame
def local_attention_step(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, pos: int, heads: int) -> torch.Tensor:
    """qkv [B, 1, 3 x H] (c_attn's output: q, k, v); cos/sin [1, 1, 1, d] of local position `pos`
    (interleaved pairs); caches [B, positions, heads, d]. Writes the rotated key and the value
    at `pos` and returns the attention of the rotated query over positions [0, pos]: [B, 1, H]."""
    if not is_supported(qkv):
        return reference_local_attention_step(qkv, cos, sin, k_cache, v_cache, pos, heads)
    b, width = qkv.shape[0], qkv.shape[-1] // 3
    head_dim = width // heads
    flat = qkv.reshape(b, -1)
    out = torch.empty(b, 1, width, device=qkv.device, dtype=qkv.dtype)
    assert flat.stride(1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    block_h = min(LOCAL_BLOCK_H, triton.next_power_of_2(heads))
    _local_attention_kernel[(b, triton.cdiv(heads, block_h))](
        flat, cos.reshape(-1), sin.reshape(-1), k_cache, v_cache, out, pos, head_dim ** -0.5,
        flat.stride(0), k_cache.stride(0), k_cache.stride(1), out.stride(0),
        HEADS=heads, HEAD_DIM=head_dim, BLOCK_H=block_h, HALF=triton.next_power_of_2(head_dim // 2),
        num_warps=NUM_WARPS)
    return out


def reference_local_attention_step(qkv, cos, sin, k_cache, v_cache, pos, heads):
    """The same in torch, as frame.local_step does it with the compiled kernels' math."""
    q, k, v = local_qkv_rope(qkv, cos, sin, heads)
    k_cache[:, pos:pos + 1] = k
    v_cache[:, pos:pos + 1] = v
    out = local_attention_reduced(q, k_cache[:, :pos + 1], v_cache[:, :pos + 1])
    return out.reshape(qkv.shape[0], 1, -1)


@jit
def _local_attention_kernel(qkv_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, out_ptr, pos, scale,
                            stride_qkv, stride_cb, stride_ct, stride_out,
                            HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                            HALF: tl.constexpr):
    """One (row, block of heads). Every tile is a head's dims read contiguously ([BLOCK_H, 2 HALF],
    the dims past HEAD_DIM masked to 0); q and k are split into their (2i, 2i+1) pairs in registers
    for the interleaved rotation and joined back, so the dot products run on whole tiles."""
    b = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, 2 * HALF)
    mask = (heads < HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    offs = heads[:, None] * HEAD_DIM + dims[None, :]
    dtype = qkv_ptr.dtype.element_ty
    # cos/sin hold each pair's value twice (dims 2i and 2i+1), so the even dims' copy serves the pair
    cos, _ = tl.split(tl.reshape(tl.load(cos_ptr + dims, mask=dims < HEAD_DIM, other=0.0).to(tl.float32), [HALF, 2]))
    sin, _ = tl.split(tl.reshape(tl.load(sin_ptr + dims, mask=dims < HEAD_DIM, other=0.0).to(tl.float32), [HALF, 2]))
    row = qkv_ptr + b * stride_qkv + offs
    width = HEADS * HEAD_DIM
    q = _rotate_pairs(tl.load(row, mask=mask, other=0.0).to(tl.float32), cos, sin, BLOCK_H, HALF).to(dtype)
    k = _rotate_pairs(tl.load(row + width, mask=mask, other=0.0).to(tl.float32), cos, sin, BLOCK_H, HALF).to(dtype)
    v = tl.load(row + 2 * width, mask=mask, other=0.0)
    cache_dtype = k_cache_ptr.dtype.element_ty
    k, v = k.to(cache_dtype), v.to(cache_dtype)
    tl.store(k_cache_ptr + b * stride_cb + pos * stride_ct + offs, k, mask=mask)
    tl.store(v_cache_ptr + b * stride_cb + pos * stride_ct + offs, v, mask=mask)
    q = q.to(tl.float32)
    # Online softmax over positions [0, pos]: `pos` itself from the registers (another thread's
    # store of it need not be visible yet), the earlier ones from the cache.
    row_max = tl.sum(q * k.to(tl.float32), 1) * scale
    row_sum = tl.full([BLOCK_H], 1.0, tl.float32)
    acc = v.to(tl.float32)
    for p in range(0, pos):
        at = b * stride_cb + p * stride_ct + offs
        score = tl.sum(q * tl.load(k_cache_ptr + at, mask=mask, other=0.0).to(tl.float32), 1) * scale
        new_max = tl.maximum(row_max, score)
        alpha = tl.exp(row_max - new_max)
        weight = tl.exp(score - new_max)
        acc = acc * alpha[:, None] + weight[:, None] * tl.load(v_cache_ptr + at, mask=mask, other=0.0).to(tl.float32)
        row_sum = row_sum * alpha + weight
        row_max = new_max
    tl.store(out_ptr + b * stride_out + offs, (acc / row_sum[:, None]).to(out_ptr.dtype.element_ty), mask=mask)


@jit
def _rotate_pairs(x, cos, sin, BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    """x [BLOCK_H, 2 HALF] fp32 with pairs (2i, 2i+1) rotated by the pair's cos/sin [HALF]."""
    even, odd = tl.split(tl.reshape(x, [BLOCK_H, HALF, 2]))
    rotated = tl.join(even * cos[None, :] - odd * sin[None, :], odd * cos[None, :] + even * sin[None, :])
    return tl.reshape(rotated, [BLOCK_H, 2 * HALF])
