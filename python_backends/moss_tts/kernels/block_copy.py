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

import torch

from .triton_setup import INTERPRET, jit, tl, triton

BLOCK = 2048  # elements a loop iteration moves (a 16-row block of 8 heads x 128 is 16,384)
NUM_WARPS = 4


def is_supported(t: torch.Tensor) -> bool:
    """The kernel can run here: triton importable, t on CUDA (or TRITON_INTERPRET=1 for CPU tests)."""
    return triton is not None and (INTERPRET or t.is_cuda)


def copy_blocks(src: tuple[torch.Tensor, torch.Tensor], dst: tuple[torch.Tensor, torch.Tensor],
                src_index: torch.Tensor, dst_index: torch.Tensor) -> None:
    """For K and V (src[0] -> dst[0], src[1] -> dst[1]), every layer and every pair i:
    dst[:, dst_index[i]] = src[:, src_index[i]]. Tensors [layers, blocks, *block] with each block
    contiguous (the pool, or the slots seen as blocks); indices [n] long on the device, dst
    indices distinct (the callers' plans make them so). The torch path where the kernel cannot run."""
    n = src_index.shape[0]
    if n == 0:
        return
    if not is_supported(src[0]):
        for s, d in zip(src, dst):
            d.index_copy_(1, dst_index, s.index_select(1, src_index))
        return
    shapes = {t.shape[2:] for t in (*src, *dst)}
    assert len(shapes) == 1 and all(t.shape[0] == src[0].shape[0] for t in (*src, *dst)), "one block shape"
    size = src[0][0, 0].numel()
    for t in (*src, *dst):
        assert t[0, 0].is_contiguous() and t.stride(1) == size, "each block contiguous, blocks packed"
    assert src[0].stride() == src[1].stride() and dst[0].stride() == dst[1].stride(), "K and V laid out alike"
    _copy_blocks_kernel[(n, src[0].shape[0], 2)](
        src[0], src[1], dst[0], dst[1], src_index, dst_index, size,
        src[0].stride(0), src[0].stride(1), dst[0].stride(0), dst[0].stride(1),
        BLOCK=min(BLOCK, triton.next_power_of_2(size)), num_warps=NUM_WARPS)


@jit
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
