"""Prefix blocks copied between the KV slots and the prefix pool in one kernel launch.

A step that admits prompts with reused prefixes copies their pool blocks into the slots (and
stores new blocks back): for K and V, an `index_select` into a temporary and an `index_copy_`
out of it, 64 blocks at a time to bound the temporary. A wave of 50 prompts sharing a 64-row
instruction block is 200 blocks: 16 torch calls on the engine thread, each giving up the GIL
while the wave's stream threads want it (a wave's launch phase took 17-40 ms a step on an H200,
issue 34, round 13), and twice the bytes through memory. Here one launch copies every block of
both tensors directly, every layer: program (pair, layer, K or V) moves one block.

Nothing is read back to the host; the grid depends on the number of pairs only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .triton_setup import INTERPRET, jit, tl, triton

BLOCK = 2048  # elements a loop iteration moves (a 16-row block of 8 heads x 128 is 16,384)
NUM_WARPS = 4


def is_supported(t: torch.Tensor) -> bool:
    """The kernel can run here: triton importable, t on CUDA (or TRITON_INTERPRET=1 for CPU tests)."""
    return triton is not None and (INTERPRET or t.is_cuda)


@dataclass(frozen=True)
class BlockPair:
    """K and V as blocks, [layers, blocks, *block] each, and what a launch needs of their layout,
    worked out once (StaticKVCache.setup): a launch on the engine thread then makes no torch call
    but the launch itself (each would give up the GIL under load)."""

    k: torch.Tensor
    v: torch.Tensor
    size: int  # elements of a block
    layer_stride: int
    block_stride: int

    @classmethod
    def of(cls, k: torch.Tensor, v: torch.Tensor) -> "BlockPair":
        size = k[0, 0].numel()
        assert k.shape == v.shape and k.stride() == v.stride(), "K and V laid out alike"
        assert k[0, 0].is_contiguous() and k.stride(1) == size, "each block contiguous, blocks packed"
        return cls(k, v, size, k.stride(0), k.stride(1))


def copy_blocks(src: BlockPair, dst: BlockPair, src_index: torch.Tensor, dst_index: torch.Tensor) -> None:
    """For K and V, every layer and every pair i: dst[:, dst_index[i]] = src[:, src_index[i]]; indices
    [n] long on the device, dst indices distinct (the callers' plans make them so), n >= 1. The
    caller checked is_supported once."""
    assert src.size == dst.size and src.k.shape[0] == dst.k.shape[0], "one block shape, one layer count"
    _copy_blocks_kernel[(src_index.shape[0], src.k.shape[0], 2)](
        src.k, src.v, dst.k, dst.v, src_index, dst_index, src.size,
        src.layer_stride, src.block_stride, dst.layer_stride, dst.block_stride,
        BLOCK=min(BLOCK, triton.next_power_of_2(src.size)), num_warps=NUM_WARPS)


# The index tensors are views into one upload at any 8-byte offset: without this, each 16-byte
# alignment case would compile a variant of its own on the engine thread, mid-serving.
_jit = (lambda fn: triton.jit(fn, do_not_specialize_on_alignment=["src_index", "dst_index"])) if triton else jit


@_jit
def _copy_blocks_kernel(src_k, src_v, dst_k, dst_v, src_index, dst_index, size,
                        src_layer, src_block, dst_layer, dst_block, BLOCK: tl.constexpr):
    """One (pair, layer, K or V): `size` elements of a block, BLOCK at a time."""
    i = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    s = tl.load(src_index + i).to(tl.int64)
    d = tl.load(dst_index + i).to(tl.int64)
    src_at = layer * src_layer + s * src_block  # int64: the caches pass 2**31 elements
    dst_at = layer * dst_layer + d * dst_block
    offs = tl.arange(0, BLOCK)
    if tl.program_id(2) == 0:
        src, dst = src_k + src_at, dst_k + dst_at
    else:
        src, dst = src_v + src_at, dst_v + dst_at
    for start in range(0, size, BLOCK):
        mask = start + offs < size
        tl.store(dst + start + offs, tl.load(src + start + offs, mask=mask), mask=mask)
