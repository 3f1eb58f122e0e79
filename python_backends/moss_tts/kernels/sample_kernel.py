"""One codebook's draw as one Triton kernel: repetition penalty, temperature, an in-register sort,
top-k, top-p, the Gumbel-max draw and greedy argmax, one program per row.

The torch path (fused.penalized_scores -> torch.sort -> sampler.draw) is two fused kernels
around a sort that round-trips [B, V] scores and ids through global memory; here a row's V scores stay in
registers from load to token id. The result is the torch path's, bit for bit where it can be:

- The sort is tl.sort over packed int64 keys: the fp32 score made order-preserving in the high
  32 bits, (BLOCK - 1 - token id) in the low bits, so equal scores put the lower id first, the
  order of torch.sort(descending=True, stable=True). -0.0 is folded into +0.0 first, as torch
  compares them equal.
- The noise is sampler.gumbel_noise op for op: the same int64 hash (sampler._mul32's split, so
  no product leaves 64 bits), then float64 -log(-log(u)) with libdevice's log on a GPU, bit for
  bit torch's CUDA log (tests/test_sample_kernel.py checks both on an H200).
- fp32 divisions are div_rn (Triton's `/` is approximate) and exp is libdevice's on a GPU, so
  only the softmax's summation order can differ from torch: a row's top-p cut can move only
  where a cumulative probability lies within rounding (~1e-6) of top_p.

Grid and allocation depend only on shapes and nothing is read back, so a call can be captured
in a CUDA graph.
"""

from __future__ import annotations

import torch

from ..model.sampler import draw, temperature_scores
from .fused import penalized_scores
from .triton_setup import INTERPRET, jit, tl, triton

try:  # log and exp of the draw on a GPU, as torch computes them
    from triton.language.extra import libdevice
except ImportError:  # GPU-less installs: draw_tokens falls back to reference_draw
    triton = None

MAX_VOCAB = 4096  # 4096 int64 keys + fp32/fp64 temporaries still fit one program's registers
MIN_BLOCK = 16  # the stop head's 2 logits are padded with -inf to this many
# Rows whose top_k is below this draw from their FAST_K best scores (tl.topk) instead of a full
# sort, unless the k-th score's ties run past them; the audio codebooks' default top_k is 25
# (contract/sampling_options.py)
FAST_K = 32


def draw_tokens(logits: torch.Tensor, seen: torch.Tensor | None, penalty: torch.Tensor,
                temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor,
                position: torch.Tensor) -> torch.Tensor:
    """logits [B, V] (any float dtype), seen [B, V] bool or None (None = no repetition penalty, the stop head),
    penalty/temperature/top_p [B] float32, top_k/seed/position [B] int64 -> token ids [B] int64.
    Same result as the torch path: fused.penalized_scores (or temperature_scores when seen is None)
    -> sort -> sampler.draw. Rows of logits and seen may be strided (e.g. seen[:, c] of [B, n_vq, V])."""
    if not is_supported(logits):
        return reference_draw(logits, seen, penalty, temperature, top_k, top_p, seed, position)
    return _triton_draw(logits, seen, penalty, temperature, top_k, top_p, seed, position)


def is_supported(logits: torch.Tensor) -> bool:
    """True when the kernel can run here: triton importable, logits on CUDA (or TRITON_INTERPRET=1
    is set, for CPU tests), a float [B, V] with V <= MAX_VOCAB (padded to a power of two)."""
    if triton is None or not (INTERPRET or logits.is_cuda):
        return False
    return logits.dim() == 2 and logits.is_floating_point() and 1 <= logits.shape[1] <= MAX_VOCAB


def reference_draw(logits: torch.Tensor, seen: torch.Tensor | None, penalty: torch.Tensor,
                   temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor,
                   position: torch.Tensor) -> torch.Tensor:
    """Same contract in plain torch: the engine's path with a stable sort, which fixes the order of
    equal scores (lower id first) that top-p depends on; the fallback and the tests' oracle."""
    if seen is None:
        scores, scaled, is_greedy = temperature_scores(logits, temperature)
    else:
        scores, scaled, is_greedy = penalized_scores(logits, seen, penalty, temperature)
    sorted_scores, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    return draw(sorted_scores, sorted_ids, scores, is_greedy, top_k, top_p, seed, position)


def kernel_noise(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's noise port on its own, to check it against sampler.counter_hash/gumbel_noise:
    seed/position [B] int64 -> (hash [B, vocab] int64, noise [B, vocab] float64) of token ids 0..vocab-1."""
    num_rows, block = seed.shape[0], _block(vocab)
    hashes = torch.empty(num_rows, vocab, dtype=torch.long, device=seed.device)
    noise = torch.empty(num_rows, vocab, dtype=torch.float64, device=seed.device)
    if num_rows:
        _noise_kernel[(num_rows,)](seed, position, hashes, noise, vocab, BLOCK=block, LIBDEVICE=not INTERPRET,
                                   num_warps=_num_warps(block))
    return hashes, noise


def _block(vocab: int) -> int:
    return max(MIN_BLOCK, triton.next_power_of_2(vocab))


def _num_warps(block: int) -> int:
    # 4 keys per thread at V = 1024: on an H200 one row's draw takes 12 us with 8 warps, 13 with 4,
    # 28 with 2 (the sort's compare-and-swap stages are most of it)
    return max(1, min(16, block // 128))


def _triton_draw(logits, seen, penalty, temperature, top_k, top_p, seed, position):
    num_rows, vocab = logits.shape
    out = torch.empty(num_rows, dtype=torch.long, device=logits.device)
    if num_rows == 0:
        return out
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    has_seen = seen is not None
    if has_seen and seen.stride(1) != 1:
        seen = seen.contiguous()
    seen_arg = seen if has_seen else logits  # never read: HAS_SEEN prunes the load
    block = _block(vocab)
    _draw_kernel[(num_rows,)](
        logits, logits.stride(0), seen_arg, seen.stride(0) if has_seen else 0, penalty, temperature, top_k, top_p,
        seed, position, out, vocab, HAS_SEEN=has_seen, BLOCK=block, FAST_K=FAST_K, LIBDEVICE=not INTERPRET,
        num_warps=_num_warps(block))
    return out


@jit
def _mul32(a, c: tl.constexpr):
    """(a * c) mod 2**32 for 0 <= a < 2**32, split like sampler._mul32 so no product overflows."""
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & 0xFFFFFFFF


@jit
def _rotl32(x, r: tl.constexpr):
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


@jit
def _mix(h, k):
    k = _mul32(_rotl32(_mul32(k & 0xFFFFFFFF, 0xCC9E2D51), 15), 0x1B873593)
    h = _rotl32(h ^ k, 13)
    return (_mul32(h, 5) + 0xE6546B64) & 0xFFFFFFFF


@jit
def _fmix(h):
    h = _mul32(h ^ (h >> 16), 0x85EBCA6B)
    h = _mul32(h ^ (h >> 13), 0xC2B2AE35)
    return h ^ (h >> 16)


@jit
def _row_hash(seed, position):
    """sampler.counter_hash's state after seed and position: once per row, not per token."""
    return _mix(_mix(seed * 0, seed), position)  # the state starts at 0, as zeros_like(seed) there


@jit
def _gumbel(row_hash, token, LIBDEVICE: tl.constexpr):
    """sampler.gumbel_noise of int64 token ids, given the row's _row_hash; float64 like torch."""
    h = _fmix(_mix(row_hash, token) ^ 12)
    u = (h.to(tl.float64) + 0.5) * (1.0 / 4294967296.0)  # exact, as torch's division by 2**32
    if LIBDEVICE:
        return -libdevice.log(-libdevice.log(u))
    return -tl.log(-tl.log(u))  # the interpreter cannot call libdevice


@jit
def _noise_kernel(seed_ptr, position_ptr, hash_ptr, noise_ptr, vocab, BLOCK: tl.constexpr,
                  LIBDEVICE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    token = tl.arange(0, BLOCK).to(tl.int64)
    row_hash = _row_hash(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    in_vocab = token < vocab
    tl.store(hash_ptr + row * vocab + token, _fmix(_mix(row_hash, token) ^ 12), mask=in_vocab)
    tl.store(noise_ptr + row * vocab + token, _gumbel(row_hash, token, LIBDEVICE), mask=in_vocab)


@jit
def _ordered_bits(x):
    """fp32 <-> int32 whose signed order is the float order (an involution: it also decodes)."""
    return tl.where(x < 0, x ^ 0x7FFFFFFF, x)


@jit
def _draw_kernel(logits_ptr, logits_stride, seen_ptr, seen_stride, penalty_ptr, temperature_ptr, top_k_ptr,
                 top_p_ptr, seed_ptr, position_ptr, out_ptr, vocab, HAS_SEEN: tl.constexpr, BLOCK: tl.constexpr,
                 FAST_K: tl.constexpr, LIBDEVICE: tl.constexpr):
    """One row: the scores never leave registers; comments name the torch op each step repeats."""
    row = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, BLOCK)
    in_vocab = idx < vocab
    # padding is -inf: sorted after every real entry (its ids are larger), never kept, never drawn
    scores = tl.load(logits_ptr + row * logits_stride + idx, mask=in_vocab, other=float("-inf")).to(tl.float32)
    if HAS_SEEN:  # penalized_scores
        seen = tl.load(seen_ptr + row * seen_stride + idx, mask=in_vocab, other=0).to(tl.int1)
        penalty = tl.load(penalty_ptr + row) + tl.zeros([BLOCK], tl.float32)
        scores = tl.where(seen, tl.where(scores < 0, scores * penalty, tl.math.div_rn(scores, penalty)), scores)
    temperature = tl.load(temperature_ptr + row)
    is_greedy = temperature == 0
    scaled = tl.math.div_rn(scores, tl.where(is_greedy, 1.0, temperature) + tl.zeros([BLOCK], tl.float32))
    scaled = tl.where(scaled == 0.0, 0.0, scaled)  # -0.0 == +0.0 for torch.sort: same key, id decides

    # torch.sort(scaled, descending=True, stable=True) in registers: the id bits make every key
    # unique, so the unstable bitonic sort has only one possible result
    bits = _ordered_bits(scaled.to(tl.int32, bitcast=True))
    keys = (bits.to(tl.int64) << 32) | (BLOCK - 1 - idx).to(tl.int64)
    top_k = tl.load(top_k_ptr + row)
    top_k = tl.where((top_k <= 0) | (top_k > vocab), vocab, top_k)
    top_p = tl.load(top_p_ptr + row)
    row_hash = _row_hash(tl.load(seed_ptr + row), tl.load(position_ptr + row))
    token = row * 0  # int64, set by one of the two draws below
    is_fast = False
    if BLOCK > FAST_K:
        is_fast = top_k < FAST_K
        if is_fast:
            # tl.topk gives the FAST_K best keys in the full sort's order (a bitonic top-k: about a
            # third of the sort's compare-and-swap stages at V = 1024). Top-k keeps the entries
            # scoring at least the k-th; when the last of the FAST_K scores lies below it, every
            # kept entry is among them and the rest would be -inf (no weight) in the full draw.
            best = tl.topk(keys, FAST_K)
            best_scores = _ordered_bits((best >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
            kth = tl.max(tl.where(tl.arange(0, FAST_K) == top_k - 1, best_scores, float("-inf")), 0)
            # A NaN score (a sign-bit NaN orders below -inf, outside the best) is kept by the full
            # draw's top-k (NaN < kth is false): such rows take the full sort
            no_nan = tl.max((scaled != scaled).to(tl.int32), 0) == 0
            is_fast = (tl.min(best_scores, 0) < kth) & no_nan
            if is_fast:
                token = _draw_sorted(best, top_k, top_p, row_hash, is_greedy, BLOCK, FAST_K, LIBDEVICE)
    if not is_fast:  # top_k >= FAST_K, or the k-th score's ties run past the FAST_K best
        token = _draw_sorted(tl.sort(keys, descending=True), top_k, top_p, row_hash, is_greedy, BLOCK, BLOCK,
                             LIBDEVICE)
    tl.store(out_ptr + row, token)


@jit
def _draw_sorted(keys, top_k, top_p, row_hash, is_greedy, BLOCK: tl.constexpr, N: tl.constexpr,
                 LIBDEVICE: tl.constexpr):
    """The draw from a row's N best keys in descending order (N = BLOCK: all of them; N < BLOCK
    only when top-k cuts every entry beyond them, which as -inf add nothing to the softmax)."""
    idx = tl.arange(0, N)
    sorted_scores = _ordered_bits((keys >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
    sorted_ids = BLOCK - 1 - (keys & 0xFFFFFFFF)

    # top-k: `<` keeps every tie of the k-th score
    kth = tl.max(tl.where(idx == top_k - 1, sorted_scores, float("-inf")), 0)
    sorted_scores = tl.where(sorted_scores < kth, float("-inf"), sorted_scores)

    # top-p: entry i goes when the cumulative probability up to i - 1 exceeds top_p; the cumulative
    # sum only grows (a rounding-level dip could matter only at the top_p boundary anyway), so that
    # is every entry after the first one past top_p, with no shift of the scan in registers
    shifted = sorted_scores - tl.max(sorted_scores, 0)
    if LIBDEVICE:
        weights = libdevice.exp(shifted)
    else:
        weights = tl.exp(shifted)
    cumulative = tl.cumsum(tl.math.div_rn(weights, tl.sum(weights, 0) + tl.zeros([N], tl.float32)), 0)
    last_kept = tl.min(tl.where(cumulative > top_p, idx, N), 0)
    last_kept = tl.where(top_p < 1.0, last_kept, N)  # top_p 1.0 is off, whatever the rounding
    sorted_scores = tl.where(idx > last_kept, float("-inf"), sorted_scores)

    # Gumbel-max in float64; argmax keeps the first maximum in sorted order, as torch's does
    perturbed = sorted_scores.to(tl.float64) + _gumbel(row_hash, sorted_ids, LIBDEVICE)
    best = tl.argmax(perturbed, 0)
    drawn = tl.sum(tl.where(idx == best, sorted_ids, 0), 0)
    # greedy: scaled == scores when temperature is 0, so the stable sort's first id is torch's argmax
    greedy = tl.sum(tl.where(idx == 0, sorted_ids, 0), 0)
    return tl.where(is_greedy, greedy, drawn)
