"""Sliding-window causal attention of the codec's transformer stages, streaming or offline.

One call does everything a codec attention layer needs between its two projections:
1. RoPE on q and k (adjacent pairs, fp32 arithmetic, result in the activations' dtype), from a
   table of cos/sin that `rope_table` computes once per stage and step for all its layers;
2. attention where the query at stream position p sees exactly the keys p-W+1 .. p;
3. streaming only: the keys before the chunk are read from the layer's ring buffers in place, at
   the slot of each decoded row (position p lives in ring slot p % W), and afterwards only the
   last min(T, W) new keys/values are written into their ring slots.
So a step never gathers a row's state, concatenates cache and new keys, or scatters state back.

Streaming steps come in two layouts. Batched: qkv [n, T, ...], every row brings T tokens.
Packed (`Ring.starts`/`lengths` set): qkv [1, N, ...] holds the rows' tokens back to back, row i
at tokens starts[i] .. starts[i] + lengths[i] - 1, so rows of different lengths share one step
(the vocoder decodes a round of 2-, 4- and 10-frame chunks in one call instead of one per
length: each codec call has a ~4.5 ms floor on the H200). Tokens no row covers are padding:
they are never read, written to a ring or stored (their output holds whatever the memory held;
the reference writes 0 there).

Inputs come straight from the fused in_proj output qkv [n, T, 3*H*Dh] (per token: the q heads,
then the k heads, then the v heads) and the output [n, T, H*Dh] is what out_proj reads, so no
permute copies either. On CUDA (or with TRITON_INTERPRET=1 for CPU tests) three Triton kernels
run: RoPE in place on the q/k part of qkv (the caller's temporary), flash attention over the two
key sources (ring, then the chunk's own keys, in one loop of key tiles; only the tiles at the
window's edge and the diagonal are masked) with an online softmax, and the ring write.
Elsewhere `reference_window_attention` runs in plain torch; it is also the tests' oracle.
Grids and allocations depend only on shapes, nothing is read back to the host: capturable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kv_format import cache_value, to_cache
from .triton_setup import INTERPRET, LOG2E, jit, tl, triton

# Over 300 lines (a kernel file): its three Triton kernels, their launcher and the torch reference
# that CPUs run and tests compare against share one layout (Rope, Ring, packed rows); apart, each
# file would have to restate it. Their jit helpers (_rotated, _ring_of, _query_block, _write_ring)
# are fused_window_attention.py's too, so the one-kernel path computes exactly what these do.

BLOCK_N = 64  # keys per inner-loop tile
ROPE_BLOCK_T = 32  # tokens per RoPE / ring-write program
ROPE_HEADS = 4  # q/k heads per RoPE program (at most)
NUM_WARPS = 4
NUM_STAGES = 2


@dataclass(frozen=True)
class Rope:
    """cos/sin [n or 1, T, head_dim/2] fp32 of one stage's positions (n = 1: shared by every row)."""
    cos: torch.Tensor
    sin: torch.Tensor


@dataclass(frozen=True)
class Ring:
    """One attention layer's ring buffers and the rows one streaming step decodes.
    keys/values [S, H, W, Dh] cover every slot of the decode state (views of its cache), in the
    activations' dtype or fp8 e4m3 (the codec's ring_dtype: written by kv_format's rule, clamped
    and rounded once; widened on every read); rows [n]
    long names each step row's slot; offsets [n] long is each row's stream position of its first
    new token at this stage (tokens before it are in the ring, at slot position % W)."""
    keys: torch.Tensor
    values: torch.Tensor
    rows: torch.Tensor
    offsets: torch.Tensor
    # Packed layout only: each row's first token in qkv [1, N, ...] and its token count [n] long,
    # and the largest count any row may have (a Python int: it sizes the kernels' grids, so a
    # captured graph serves every packing of its shape).
    starts: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    max_len: int = 0

    @property
    def is_packed(self) -> bool:
        return self.starts is not None


def rope_frequencies(head_dim: int, max_period: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """[head_dim/2] fp32 angular frequencies of the pairs (upstream arithmetic)."""
    return torch.exp(torch.arange(head_dim // 2, device=device, dtype=torch.float32)
                     * (-math.log(max_period) * 2 / head_dim))


def rope_table(positions: torch.Tensor, head_dim: int, max_period: float,
               freqs: torch.Tensor | None = None) -> Rope:
    """positions [n, T] (absolute stream positions) -> Rope, in fp32. `freqs` (rope_frequencies
    of the same head_dim and period, kept by the caller) saves recomputing them per call."""
    if freqs is None:
        freqs = rope_frequencies(head_dim, max_period, positions.device)
    angles = positions.to(torch.float32)[..., None] * freqs
    return Rope(torch.cos(angles), torch.sin(angles))


def rotate(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x [B, H, T, D] by the table's angles."""
    d = x.shape[-1]
    cos, sin = rope.cos[:, None], rope.sin[:, None]
    real, imag = x.float().unflatten(-1, (d // 2, 2)).unbind(-1)
    out = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, max_period: float) -> torch.Tensor:
    """Rotate x [B, H, T, D] by absolute positions [B, T]."""
    return rotate(x, rope_table(positions, x.shape[-1], max_period))


def window_attention(qkv: torch.Tensor, rope: Rope, num_heads: int, window: int, ring: Ring | None = None,
                     scale: float | None = None) -> torch.Tensor:
    """qkv [n, T, 3*H*Dh] (in_proj output; the Triton path rotates its q/k part in place) ->
    [n, T, H*Dh]. Query t (stream position offset + t) sees keys t-window+1 .. t; with `ring`,
    keys before the chunk come from the ring and the chunk's last min(T, window) keys/values are
    written into it. A packed ring (module docstring) takes qkv [1, N, ...] and the rope table
    of every token's own position. Default scale 1/sqrt(Dh)."""
    if is_supported(qkv, num_heads, ring):
        return _triton_window_attention(qkv, rope, num_heads, window, ring, scale)
    return reference_window_attention(qkv, rope, num_heads, window, ring, scale)


def can_run_triton(tensor: torch.Tensor) -> bool:
    """True when Triton kernels can run on tensor's device: triton importable, and CUDA (or
    TRITON_INTERPRET=1, for CPU tests)."""
    return triton is not None and (INTERPRET or tensor.is_cuda)


def is_supported(qkv: torch.Tensor, num_heads: int, ring: Ring | None = None) -> bool:
    """True when the Triton kernels can run here (can_run_triton), head_dim a power of two >= 16
    (tl.dot), dense rows."""
    if not can_run_triton(qkv):
        return False
    head_dim = qkv.shape[-1] // (3 * num_heads)
    dense = qkv.stride(-1) == 1 and (ring is None or ring.keys.stride(-1) == ring.values.stride(-1) == 1)
    is_pow2 = head_dim >= 16 and head_dim & (head_dim - 1) == 0
    return dense and is_pow2 and qkv.dtype in (torch.float16, torch.bfloat16, torch.float32)


# ------------------------------------------------------------------------------------ reference
def reference_window_attention(qkv: torch.Tensor, rope: Rope, num_heads: int, window: int,
                               ring: Ring | None = None, scale: float | None = None) -> torch.Tensor:
    """Same contract in plain torch (qkv is left as it is): the CPU path and the tests' oracle."""
    if ring is not None and ring.is_packed:
        return _reference_packed(qkv, rope, num_heads, window, ring, scale)
    n, t, _ = qkv.shape
    q, k, v = qkv.view(n, t, 3, num_heads, -1).permute(2, 0, 3, 1, 4)  # [n, H, T, Dh] each
    q, k = rotate(q, rope), rotate(k, rope)
    if ring is None:
        out = local_causal_attention(q, k, v, window, scale)
    else:
        out = _ring_attention(q, k, v, ring, window, scale)
        _ring_write(k, v, ring, window)
    return out.transpose(1, 2).reshape(n, t, -1)


def _reference_packed(qkv: torch.Tensor, rope: Rope, num_heads: int, window: int, ring: Ring,
                      scale: float | None) -> torch.Tensor:
    """The packed layout through the batched reference: each row's tokens gathered into a batch
    padded to its longest row, then only the real tokens' outputs and keys kept. A padded query
    comes after its row's real ones, so causality keeps it out of their results."""
    length = int(ring.lengths.max()) if ring.lengths.numel() else 0
    out = qkv.new_zeros(qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3)
    if length == 0:
        return out
    steps = torch.arange(length, device=qkv.device)
    real = steps[None, :] < ring.lengths[:, None]  # [n, L]
    index = torch.where(real, ring.starts[:, None] + steps, 0)  # padding reads token 0, harmlessly
    rows_rope = Rope(rope.cos[0][index], rope.sin[0][index])  # every token's own angles
    batch = qkv[0][index]  # [n, L, 3*H*Dh]
    n, t, _ = batch.shape
    q, k, v = batch.view(n, t, 3, num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k = rotate(q, rows_rope), rotate(k, rows_rope)
    result = _ring_attention(q, k, v, ring, window, scale).transpose(1, 2).reshape(n, t, -1)
    out[0][index[real]] = result[real].to(out.dtype)
    # The last min(length, W) real keys of each row into its ring slots.
    kept = real & (steps[None, :] >= ring.lengths[:, None] - window)
    slots = torch.remainder(ring.offsets[:, None] + steps, window)[kept]
    rows = ring.rows[:, None].expand(n, t)[kept]
    ring.keys[rows, :, slots] = to_cache(k.transpose(1, 2)[kept], ring.keys.dtype)
    ring.values[rows, :, slots] = to_cache(v.transpose(1, 2)[kept], ring.values.dtype)
    return out


def local_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                           scale: float | None = None) -> torch.Tensor:
    """Attention where query t sees keys t-window+1 .. t. Inputs [B, H, T, D]; computed in blocks
    of `window` queries, so memory is O(T x window) instead of O(T^2)."""
    t = q.shape[2]
    if t <= window:  # the window cannot bind: plain causal attention
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
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
    out = F.scaled_dot_product_attention(qb, two_blocks(k), two_blocks(v), attn_mask=mask, scale=scale)
    return out.flatten(2, 3)[:, :, :t]


def _ring_attention(q, k, v, ring: Ring, window: int, scale) -> torch.Tensor:
    """q/k/v [n, H, T, Dh] (rotated) against the rows' rings + the chunk's own keys."""
    t = q.shape[2]
    offset = ring.offsets
    pos_q = offset[:, None] + torch.arange(t, device=q.device)
    # Ring slot j holds the latest position p < offset with p % W == j (negative: never written).
    slot = torch.arange(window, device=q.device)
    pos_cached = offset[:, None] - 1 - torch.remainder(offset[:, None] - 1 - slot, window)
    pos_k = torch.cat([pos_cached, pos_q], dim=1)
    delta = pos_q[:, :, None] - pos_k[:, None, :]
    mask = (pos_k[:, None, :] >= 0) & (delta >= 0) & (delta < window)
    keys = torch.cat([ring.keys.index_select(0, ring.rows).to(k.dtype), k], dim=2)
    values = torch.cat([ring.values.index_select(0, ring.rows).to(v.dtype), v], dim=2)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], scale=scale)


def _ring_write(k, v, ring: Ring, window: int) -> None:
    """The chunk's last min(T, W) keys/values [n, H, T, Dh] into their ring slots, in place."""
    t = k.shape[2]
    kept = min(t, window)
    slots = torch.remainder(ring.offsets[:, None] + torch.arange(t - kept, t, device=k.device), window)
    rows = ring.rows[:, None].expand_as(slots)
    # Advanced indices around a slice put their dims first: [n, kept, H, Dh].
    ring.keys[rows, :, slots] = to_cache(k[:, :, t - kept:].transpose(1, 2), ring.keys.dtype)
    ring.values[rows, :, slots] = to_cache(v[:, :, t - kept:].transpose(1, 2), ring.values.dtype)


# ------------------------------------------------------------------------------------ Triton
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int  # queries per program
    block_n: int  # keys per inner-loop tile
    num_warps: int
    num_stages: int


def attention_config(t: int) -> AttentionConfig:
    """Tiles for a chunk of t queries per row: tl.dot needs >= 16 queries, and short chunks
    (2 frames) waste little padding at 16 or 32. From H200 sweeps at 256 rows
    (bench_vocoder.py --attention-sweep, perf/RESULTS.md): 2 warps for 16/32 queries; for 64
    queries 32-key tiles in 3 stages (2-6% faster than 64-key tiles at the four 400-key stages
    once the inner tiles lost their mask); 128-query tiles were slower at every stage."""
    if t <= 32:
        return AttentionConfig(16 if t <= 16 else 32, BLOCK_N, 2, NUM_STAGES)
    return AttentionConfig(64, BLOCK_N // 2, NUM_WARPS, 3)


def rope_heads_per_program(num_heads: int) -> int:
    """q and k heads one RoPE program rotates (a divisor of 2 x num_heads, at most
    ROPE_HEADS, a power of two: tl.arange needs one): several heads' loads in flight at once
    instead of one head after another."""
    group = ROPE_HEADS
    while (2 * num_heads) % group:
        group //= 2
    return group


def _triton_window_attention(qkv, rope, num_heads, window, ring, scale, config: AttentionConfig | None = None):
    n, t, width = qkv.shape
    head_dim = width // (3 * num_heads)
    packed = ring is not None and ring.is_packed
    cos, sin = rope.cos.contiguous(), rope.sin.contiguous()
    stride_rn = cos.stride(0) if cos.shape[0] > 1 else 0  # one table shared by every row (offline)
    group = rope_heads_per_program(num_heads)
    _rope_kernel[(_cdiv(t, ROPE_BLOCK_T), n, 2 * num_heads // group)](
        qkv, cos, sin, t, qkv.stride(0), qkv.stride(1), stride_rn, cos.stride(1),
        HEAD_DIM=head_dim, HEADS=group, BLOCK_T=ROPE_BLOCK_T, num_warps=NUM_WARPS)
    # Packed: tokens no row covers (a graph bucket's padding) are never stored and hold whatever
    # the memory held. Every later decoder op is token by token and the padding's audio is cut
    # off, so they reach no row; zeroing them cost a fill kernel per layer (92 graph nodes,
    # ~0.65 ms of a 256-row round on an H200).
    out = qkv.new_empty(n, t, num_heads * head_dim)
    qk_scale = (scale if scale is not None else 1.0 / math.sqrt(head_dim)) * LOG2E  # softmax in exp2
    if ring is None:  # offline: never read; any tensors of the right dtype fill the arguments
        keys, values, rows, offsets = qkv, qkv, qkv, qkv
        ring_strides = (0, 0, 0)
    else:
        keys, values, rows, offsets = ring.keys, ring.values, ring.rows, ring.offsets
        ring_strides = keys.stride()[:3]
        assert values.stride() == keys.stride(), "keys and values rings must share a layout"
    # Packed: a program per (query block of the longest row, row x head); rows read their first
    # token and length from starts/lengths, and blocks past a row's length do nothing.
    starts, lengths = (ring.starts, ring.lengths) if packed else (offsets, offsets)
    num_rows, per_row = (rows.shape[0], ring.max_len) if packed else (n, t)
    c = config or attention_config(per_row)
    _attention_kernel[(_cdiv(per_row, c.block_m), num_rows * num_heads)](
        qkv, keys, values, rows, offsets, starts, lengths, out, per_row, num_heads, window,
        qkv.stride(0), qkv.stride(1), *ring_strides, out.stride(0), out.stride(1), qk_scale,
        HAS_RING=ring is not None, PACKED=packed, HEAD_DIM=head_dim, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        num_warps=c.num_warps, num_stages=c.num_stages)
    if ring is not None:
        kept = min(per_row, window)
        _ring_write_kernel[(_cdiv(kept, ROPE_BLOCK_T), num_rows, num_heads)](
            qkv, keys, values, rows, offsets, starts, lengths, per_row, kept, num_heads, window,
            qkv.stride(0), qkv.stride(1), *ring_strides,
            PACKED=packed, HEAD_DIM=head_dim, BLOCK_T=ROPE_BLOCK_T, num_warps=NUM_WARPS)
    return out


@jit
def _rope_kernel(qkv_ptr, cos_ptr, sin_ptr, T, stride_n, stride_t, stride_rn, stride_rt,
                 HEAD_DIM: tl.constexpr, HEADS: tl.constexpr, BLOCK_T: tl.constexpr):
    """One (token block, row, group of HEADS heads): rotate those q/k heads of those tokens in
    place (heads 0..H-1 of a token are q, H..2H-1 are k: a group is contiguous). One
    [BLOCK_T, HEADS, HEAD_DIM] load and store, so a program has all its heads' loads in flight
    instead of one head's at a time: a packed 256-row round's RoPE took 2.04 ms against 2.79 for
    the per-head kernel on one H200 (issue 34, seventh round)."""
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    n = tl.program_id(1).to(tl.int64)
    first_head = tl.program_id(2) * HEADS
    offs_d = tl.arange(0, HEAD_DIM)
    offs_half = tl.arange(0, HEAD_DIM // 2)
    offs_h = tl.arange(0, HEADS)
    valid = (tok < T)[:, None, None]
    tok64 = tok.to(tl.int64)  # token x stride passes 2**31 past ~0.9 M tokens in one row (39 min of audio)
    table = n * stride_rn + tok64[:, None, None] * stride_rt + offs_half[None, None, :]
    cos = tl.load(cos_ptr + table, mask=valid, other=0.0)  # [BLOCK_T, 1, HEAD_DIM/2], shared by the heads
    sin = tl.load(sin_ptr + table, mask=valid, other=0.0)
    tile = (qkv_ptr + n * stride_n + tok64[:, None, None] * stride_t
            + (first_head + offs_h)[None, :, None] * HEAD_DIM + offs_d[None, None, :])
    x = tl.load(tile, mask=valid, other=0.0)
    tl.store(tile, _rotated(x, cos, sin, BLOCK_T, HEADS, HEAD_DIM).to(qkv_ptr.dtype.element_ty), mask=valid)


@jit
def _rotated(x, cos, sin, BLOCK_T: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """x [BLOCK_T, HEADS, HEAD_DIM] rotated in fp32 by cos/sin [BLOCK_T, 1, HEAD_DIM/2]: the one
    RoPE arithmetic of the split and the fused kernels (fused_window_attention.py), so both round
    alike. Pairs are split apart in registers."""
    real, imag = tl.split(tl.reshape(x.to(tl.float32), [BLOCK_T, HEADS, HEAD_DIM // 2, 2]))
    out = tl.join(real * cos - imag * sin, real * sin + imag * cos)
    return tl.reshape(out, [BLOCK_T, HEADS, HEAD_DIM])


@jit
def _attention_kernel(qkv_ptr, k_ring_ptr, v_ring_ptr, rows_ptr, offsets_ptr, starts_ptr, lengths_ptr, out_ptr,
                      T_max, H, W, stride_n, stride_t, stride_rs, stride_rh, stride_rw, stride_on, stride_ot,
                      qk_scale, HAS_RING: tl.constexpr, PACKED: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One (query block, row x head): online softmax over the keys the block's queries see, in
    key tiles anchored at the oldest one. Chunk-relative key index j < 0 is the ring (position
    offset + j, at most W back), j >= 0 the chunk itself; a tile's rows are loaded from
    whichever holds them. The tiles every query of the block sees whole (j from the newest
    query's window edge to the oldest query itself) run without a mask: with a 400-key window,
    64 queries and 32-key tiles, 10 of 15 tiles. Only the tiles at the window's edge and at the
    diagonal are masked. PACKED: the row's tokens start at starts[n] of the one sequence and number
    lengths[n] (T_max bounds them all)."""
    first_q = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) // H
    h = tl.program_id(1) % H
    n64 = n.to(tl.int64)
    if PACKED:
        start = tl.load(starts_ptr + n).to(tl.int64)
        T = tl.load(lengths_ptr + n).to(tl.int32)
        token = qkv_ptr + start * stride_t
        out_row = out_ptr + start * stride_ot
    else:
        T = T_max
        token = qkv_ptr + n64 * stride_n
        out_row = out_ptr + n64 * stride_on
    if HAS_RING:
        first_slot, history, ring_k, ring_v = _ring_of(k_ring_ptr, v_ring_ptr, rows_ptr, offsets_ptr, n, h, W,
                                                       stride_rs, stride_rh)
    else:
        first_slot, history, ring_k, ring_v = 0, 0, token, token  # no ring: never read
    _query_block(token, out_row, first_q, T, h, H, W, stride_t, stride_ot, ring_k, ring_v, first_slot, history,
                 stride_rw, qk_scale, HAS_RING, HEAD_DIM, BLOCK_M, BLOCK_N)


@jit
def _ring_of(k_ring_ptr, v_ring_ptr, rows_ptr, offsets_ptr, n, h, W, stride_rs, stride_rh):
    """Row n's ring at head h: the slot of the chunk's first token, how many earlier positions
    exist (at most W) and the head's key and value rings. The stream position itself is int64
    (it grows for as long as a stream lives); the kernels need only those two, both small."""
    offset = tl.load(offsets_ptr + n).to(tl.int64)
    slot_row = tl.load(rows_ptr + n).to(tl.int64)
    ring = slot_row * stride_rs + h * stride_rh
    return ((offset % W).to(tl.int32), tl.minimum(offset, W).to(tl.int32), k_ring_ptr + ring, v_ring_ptr + ring)


@jit
def _query_block(token, out_row, first_q, T, h, H, W, stride_t, stride_ot, ring_k, ring_v, first_slot, history,
                 stride_rw, qk_scale, HAS_RING: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """Queries first_q .. first_q + BLOCK_M - 1 of one (row, head) whose tokens start at `token`
    (qkv, q/k already rotated): their outputs into out_row. The one attention of the split and
    the fused kernels (fused_window_attention.py): the same tiles in the same order, bit for bit."""
    offs_m = first_q + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    # token x stride in int64: it passes 2**31 past ~0.9 M tokens in one row (39 min of audio)
    q = tl.load(token + offs_m.to(tl.int64)[:, None] * stride_t + h * HEAD_DIM + offs_d[None, :],
                mask=(offs_m < T)[:, None], other=0.0)
    k_base = token + (H + h) * HEAD_DIM
    v_base = token + (2 * H + h) * HEAD_DIM
    # Keys lo .. hi-1: the oldest any query of the block sees (never before the stream's start)
    # to the newest query. A block past its row's last token (packed rows shorter than T_max)
    # has no tiles and stores nothing.
    lo = tl.maximum(first_q - W + 1, -history)
    hi = tl.minimum(first_q + BLOCK_M, T)
    num_tiles = tl.where(first_q < T, tl.cdiv(hi - lo, BLOCK_N), 0)
    # Tile k (keys lo + k*BLOCK_N ..) is seen whole by every query when its keys lie in
    # [the newest query's window edge, the oldest query]; those tiles are k_full .. k_end-1.
    full_lo = tl.maximum(first_q + BLOCK_M - W, -history)
    k_end = tl.minimum((first_q + 1 - lo) // BLOCK_N, num_tiles)  # first_q + 1 - lo >= 1 here
    k_full = tl.minimum(tl.cdiv(full_lo - lo, BLOCK_N), k_end)  # full_lo >= lo

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for k in range(0, k_full):  # the window's edge
        row_max, row_sum, acc = _key_tile(q, row_max, row_sum, acc, lo + k * BLOCK_N, offs_m, offs_n, offs_d, hi,
                                          W, k_base, v_base, stride_t, ring_k, ring_v, first_slot, stride_rw,
                                          qk_scale, HAS_RING, True)
    for k in range(k_full, k_end):  # seen whole: no mask
        row_max, row_sum, acc = _key_tile(q, row_max, row_sum, acc, lo + k * BLOCK_N, offs_m, offs_n, offs_d, hi,
                                          W, k_base, v_base, stride_t, ring_k, ring_v, first_slot, stride_rw,
                                          qk_scale, HAS_RING, False)
    for k in range(k_end, num_tiles):  # the diagonal and the chunk's end
        row_max, row_sum, acc = _key_tile(q, row_max, row_sum, acc, lo + k * BLOCK_N, offs_m, offs_n, offs_d, hi,
                                          W, k_base, v_base, stride_t, ring_k, ring_v, first_slot, stride_rw,
                                          qk_scale, HAS_RING, True)
    # every real query sees at least itself, so row_sum > 0; padding queries are not stored
    out = acc / tl.maximum(row_sum, 1e-30)[:, None]
    tl.store(out_row + offs_m.to(tl.int64)[:, None] * stride_ot + h * HEAD_DIM + offs_d[None, :],
             out.to(out_row.dtype.element_ty), mask=(offs_m < T)[:, None])


@jit
def _key_tile(q, row_max, row_sum, acc, first, offs_m, offs_n, offs_d, hi, W, k_base, v_base, stride_t, ring_k,
              ring_v, first_slot, stride_rw, qk_scale, HAS_RING: tl.constexpr, MASKED: tl.constexpr):
    """Keys first .. first + BLOCK_N - 1 (chunk-relative, >= -W) into the online softmax. Unless
    MASKED, the caller knows every key exists and every query sees it."""
    j = first + offs_n
    row = tl.maximum(j, 0).to(tl.int64)
    if HAS_RING and ring_k.dtype.element_ty != k_base.dtype.element_ty:
        k, v = _mixed_tile(j, row, offs_d, hi, W, k_base, v_base, stride_t, ring_k, ring_v, first_slot, stride_rw,
                           MASKED)
    else:
        if HAS_RING:
            in_ring = (j < 0)[:, None]
            slot = ((first_slot + j + W) % W)[:, None]  # j >= -W
            k_ptr = tl.where(in_ring, ring_k + slot * stride_rw, k_base + row[:, None] * stride_t) + offs_d[None, :]
            v_ptr = tl.where(in_ring, ring_v + slot * stride_rw, v_base + row[:, None] * stride_t) + offs_d[None, :]
        else:
            k_ptr = k_base + row[:, None] * stride_t + offs_d[None, :]
            v_ptr = v_base + row[:, None] * stride_t + offs_d[None, :]
        if MASKED:
            k = tl.load(k_ptr, mask=(j < hi)[:, None], other=0.0)
            v = tl.load(v_ptr, mask=(j < hi)[:, None], other=0.0)
        else:
            k = tl.load(k_ptr)
            v = tl.load(v_ptr)
    if MASKED:
        is_key = j < hi
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # "ieee": no tf32 for fp32 inputs
        delta = offs_m[:, None] - j[None, :]
        scores = tl.where(is_key[None, :] & (delta >= 0) & (delta < W), scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        # A query may have seen no key yet (the window's edge): keep its -inf max from making NaNs.
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    else:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        safe_max = new_max  # every query saw a key of this tile: finite
    alpha = tl.exp2(row_max - safe_max)
    p = tl.exp2(scores - safe_max[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return new_max, row_sum * alpha + tl.sum(p, 1), acc


@jit
def _mixed_tile(j, row, offs_d, hi, W, k_base, v_base, stride_t, ring_k, ring_v, first_slot, stride_rw,
                MASKED: tl.constexpr):
    """_key_tile's keys and values over an fp8 ring (Ring): a tile may hold keys of both sources, of
    two types, so each source is its own load of the lanes it holds, the ring's widened to the
    chunk's dtype (one pointer select cannot span two element types)."""
    in_ring = (j < 0)[:, None]
    slot = ((first_slot + j + W) % W)[:, None]  # j >= -W
    ring_at, chunk_at = slot * stride_rw + offs_d[None, :], row[:, None] * stride_t + offs_d[None, :]
    from_ring, from_chunk = in_ring, ~in_ring
    if MASKED:
        from_ring, from_chunk = from_ring & (j < hi)[:, None], from_chunk & (j < hi)[:, None]
    dtype = k_base.dtype.element_ty
    k = tl.where(in_ring, tl.load(ring_k + ring_at, mask=from_ring, other=0.0).to(dtype),
                 tl.load(k_base + chunk_at, mask=from_chunk, other=0.0))
    v = tl.where(in_ring, tl.load(ring_v + ring_at, mask=from_ring, other=0.0).to(dtype),
                 tl.load(v_base + chunk_at, mask=from_chunk, other=0.0))
    return k, v


@jit
def _ring_write_kernel(qkv_ptr, k_ring_ptr, v_ring_ptr, rows_ptr, offsets_ptr, starts_ptr, lengths_ptr, T_max,
                       kept_max, H, W, stride_n, stride_t, stride_rs, stride_rh, stride_rw,
                       PACKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr):
    """One (token block, row, head): the chunk's last `kept` keys (rotated) and values into the
    ring; kept = min(T, W), of the row's own T when PACKED."""
    n = tl.program_id(1)
    h = tl.program_id(2)
    if PACKED:
        T = tl.load(lengths_ptr + n).to(tl.int32)
        kept = tl.minimum(T, W)
        row_base = qkv_ptr + tl.load(starts_ptr + n).to(tl.int64) * stride_t
    else:
        T = T_max
        kept = kept_max
        row_base = qkv_ptr + n.to(tl.int64) * stride_n
    j = T - kept + tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    first_slot, _, ring_k, ring_v = _ring_of(k_ring_ptr, v_ring_ptr, rows_ptr, offsets_ptr, n, h, W, stride_rs,
                                             stride_rh)
    _write_ring(row_base, ring_k, ring_v, j, T, first_slot, H, h, W, stride_t, stride_rw, HEAD_DIM)


@jit
def _write_ring(row_base, ring_k, ring_v, j, T, first_slot, H, h, W, stride_t, stride_rw, HEAD_DIM: tl.constexpr):
    """Keys (rotated) and values of the row's tokens j (a block, those < T kept) of head h into
    their ring slots: position offset + j lives in slot (first_slot + j) % W."""
    offs_d = tl.arange(0, HEAD_DIM)
    valid = (j < T)[:, None]
    token = row_base + j.to(tl.int64)[:, None] * stride_t + offs_d[None, :]
    k = tl.load(token + (H + h) * HEAD_DIM, mask=valid, other=0.0)
    v = tl.load(token + (2 * H + h) * HEAD_DIM, mask=valid, other=0.0)
    slot = (first_slot + j) % W  # j >= 0
    ring = slot[:, None] * stride_rw + offs_d[None, :]
    tl.store(ring_k + ring, cache_value(k, ring_k), mask=valid)  # the ring's dtype: fp8 clamps (kv_format)
    tl.store(ring_v + ring, cache_value(v, ring_v), mask=valid)
