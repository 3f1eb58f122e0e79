"""A streaming window-attention step in one kernel launch: RoPE, attention and the ring write.

window_attention.py runs a streaming layer as three kernels (RoPE, attention, ring write). The
codec decoder has ~92 attention layers, so a step carries ~184 launches (graph nodes) for RoPE and
the ring write alone; a 1-row x 2-frame step is launch-bound. This module runs the same step as
one kernel, for the streaming path only (offline stays with window_attention), chosen per layer
by the codec's serving form (`RING_KERNELS`, codec.transformer.Attention.ring_kernel) so the two
can be measured against each other on a GPU.

Why one program per (row, head), not the attention kernel's grid of query blocks: a new key at
position p overwrites ring slot p % W, which holds position p - W, and the row's earlier queries
still need that key (query q sees keys q-W+1 .. q). So a row's ring write must wait until every
query block of that row and head has read the ring; the split path gets that order from launching
the write after the attention. Here one program does, for its (row, head):
1. RoPE of the head's q and k, every token of the row, in place in qkv (the split kernel's
   arithmetic, window_attention._rotated), then a barrier: other threads of the program read them;
2. each query block of the row in turn (window_attention._query_block at attention_config of the
   same tokens per row: the split attention's tiles in its order, so the outputs are bit for bit
   the split path's);
3. a barrier, then the row's last min(T, W) rotated keys and values into the ring.
A packed row does only its own tokens' work: padding tokens are never read or written, not even
rotated (the split RoPE rotates the whole packed sequence; nothing reads the padding's q/k).
Step rows that share a ring row (the graphs' scratch row, padding) may see each other's ring
writes here; their outputs are padding's, never read, and the real rows' are unaffected.
A row of more than MAX_FUSED_QUERY_BLOCKS query blocks runs the split kernels instead.
"""

from __future__ import annotations

import math

import torch

from .triton_setup import LOG2E, jit, tl
from .window_attention import (ROPE_BLOCK_T, AttentionConfig, Ring, Rope, _cdiv, _query_block, _ring_of, _rotated,
                               _triton_window_attention, _write_ring, attention_config, is_supported, window_attention)

# How a streaming layer runs its RoPE, attention and ring write: "split" (window_attention.py's three
# kernels) or "fused" (this module's one).
RING_KERNELS = ("split", "fused")
# One program runs all of its row's query blocks one after another, so a long row loses the split
# grid's parallelism (a block per program). The codec's chunks reach 5 blocks (10 frames x 32
# tokens at stage 5, 64-query blocks); past 8 (512 tokens a row at 64) the split kernels run.
MAX_FUSED_QUERY_BLOCKS = 8


def runs_fused(tokens_per_row: int, config: AttentionConfig | None = None) -> bool:
    """True when fused_window_attention runs its one kernel (not the split fallback) for streaming
    rows of at most `tokens_per_row` tokens (Ring.max_len when packed) at `config` (default: the
    one attention_config picks)."""
    c = config or attention_config(tokens_per_row)
    return _cdiv(tokens_per_row, c.block_m) <= MAX_FUSED_QUERY_BLOCKS


def fused_window_attention(qkv: torch.Tensor, rope: Rope, num_heads: int, window: int, ring: Ring | None = None,
                           scale: float | None = None, config: AttentionConfig | None = None) -> torch.Tensor:
    """window_attention's contract (qkv rotated in place, the ring written) in one kernel for a
    streaming step; offline (ring None), where the kernels cannot run, or for rows of more than
    MAX_FUSED_QUERY_BLOCKS query blocks, what window_attention runs. `config`: other tiles than
    attention_config picks (the split fallback gets them too)."""
    if ring is None or not is_supported(qkv, num_heads, ring):
        return window_attention(qkv, rope, num_heads, window, ring, scale)
    n, t, width = qkv.shape
    per_row = ring.max_len if ring.is_packed else t
    c = config or attention_config(per_row)
    if not runs_fused(per_row, c):
        return _triton_window_attention(qkv, rope, num_heads, window, ring, scale, c)
    head_dim = width // (3 * num_heads)
    cos, sin = rope.cos.contiguous(), rope.sin.contiguous()
    stride_rn = cos.stride(0) if cos.shape[0] > 1 else 0  # one table shared by every row
    # Packed: padding tokens' outputs are never stored (window_attention.py says why no fill).
    out = qkv.new_empty(n, t, num_heads * head_dim)
    qk_scale = (scale if scale is not None else 1.0 / math.sqrt(head_dim)) * LOG2E  # softmax in exp2
    assert ring.values.stride() == ring.keys.stride(), "keys and values rings must share a layout"
    starts, lengths = (ring.starts, ring.lengths) if ring.is_packed else (ring.offsets, ring.offsets)
    _fused_ring_kernel[(ring.rows.shape[0] * num_heads,)](
        qkv, cos, sin, ring.keys, ring.values, ring.rows, ring.offsets, starts, lengths, out, per_row, num_heads,
        window, qkv.stride(0), qkv.stride(1), stride_rn, cos.stride(1), *ring.keys.stride()[:3], out.stride(0),
        out.stride(1), qk_scale, PACKED=ring.is_packed, HEAD_DIM=head_dim, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        BLOCK_T=ROPE_BLOCK_T, num_warps=c.num_warps, num_stages=c.num_stages)
    return out


@jit
def _fused_ring_kernel(qkv_ptr, cos_ptr, sin_ptr, k_ring_ptr, v_ring_ptr, rows_ptr, offsets_ptr, starts_ptr,
                       lengths_ptr, out_ptr, T_max, H, W, stride_n, stride_t, stride_rn, stride_rt, stride_rs,
                       stride_rh, stride_rw, stride_on, stride_ot, qk_scale, PACKED: tl.constexpr,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr):
    """One (row x head): RoPE of its q/k, attention of every query block, ring write (module
    docstring). PACKED: the row's tokens start at starts[n] and number lengths[n] <= T_max, and
    the RoPE table holds every packed token's angles in one row (indexed by starts[n] + t)."""
    n = tl.program_id(0) // H
    h = tl.program_id(0) % H
    n64 = n.to(tl.int64)
    if PACKED:
        start = tl.load(starts_ptr + n).to(tl.int64)
        T = tl.load(lengths_ptr + n).to(tl.int32)
        token = qkv_ptr + start * stride_t
        out_row = out_ptr + start * stride_ot
        table = start * stride_rt
    else:
        T = T_max
        token = qkv_ptr + n64 * stride_n
        out_row = out_ptr + n64 * stride_on
        table = n64 * stride_rn
    for first in range(0, T, BLOCK_T):
        _rotate_qk(token, cos_ptr + table, sin_ptr + table, first, T, h, H, stride_t, stride_rt, HEAD_DIM, BLOCK_T)
    # The query blocks read keys and queries that other threads of this program rotated: a CTA
    # barrier orders the global stores before those loads.
    tl.debug_barrier()
    first_slot, history, ring_k, ring_v = _ring_of(k_ring_ptr, v_ring_ptr, rows_ptr, offsets_ptr, n, h, W,
                                                   stride_rs, stride_rh)
    for first_q in range(0, T, BLOCK_M):
        _query_block(token, out_row, first_q, T, h, H, W, stride_t, stride_ot, ring_k, ring_v, first_slot, history,
                     stride_rw, qk_scale, True, HEAD_DIM, BLOCK_M, BLOCK_N)
    # The write overwrites ring slots that every query block above read (their keys p - W): all
    # of the program's threads must be done reading first.
    tl.debug_barrier()
    kept = tl.minimum(T, W)
    for first in range(T - kept, T, BLOCK_T):
        _write_ring(token, ring_k, ring_v, first + tl.arange(0, BLOCK_T), T, first_slot, H, h, W, stride_t,
                    stride_rw, HEAD_DIM)


@jit
def _rotate_qk(token, cos_row, sin_row, first, T, h, H, stride_t, stride_rt, HEAD_DIM: tl.constexpr,
               BLOCK_T: tl.constexpr):
    """Tokens first .. first + BLOCK_T - 1 (those < T) of one row: q head h and k head H + h
    rotated in place, one [BLOCK_T, 2, HEAD_DIM] load and store."""
    tok = first + tl.arange(0, BLOCK_T)
    valid = (tok < T)[:, None, None]
    tok64 = tok.to(tl.int64)  # token x stride passes 2**31 past ~0.9 M tokens in one row
    table = tok64[:, None, None] * stride_rt + tl.arange(0, HEAD_DIM // 2)[None, None, :]
    cos = tl.load(cos_row + table, mask=valid, other=0.0)  # [BLOCK_T, 1, HEAD_DIM/2], shared by q and k
    sin = tl.load(sin_row + table, mask=valid, other=0.0)
    heads = h + tl.arange(0, 2) * H  # heads 0..H-1 of a token are q, H..2H-1 are k
    tile = (token + tok64[:, None, None] * stride_t + heads[None, :, None] * HEAD_DIM
            + tl.arange(0, HEAD_DIM)[None, None, :])
    x = tl.load(tile, mask=valid, other=0.0)
    tl.store(tile, _rotated(x, cos, sin, BLOCK_T, 2, HEAD_DIM).to(token.dtype.element_ty), mask=valid)
