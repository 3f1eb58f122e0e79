"""Pull a tensor's bytes into the GPU's L2 cache ahead of the GEMM that reads it (issue 34).

At a few tokens a codec GEMM reads its weight once and does almost no arithmetic with it, yet
cuBLAS reads those weights at ~0.5-1.2 TB/s (round 21: 13 MB in 11 µs, 3.3 MB in 6.6 µs), far
below HBM's ~3.35-4.8: a kernel that short never gets its loads in flight. This kernel only asks
the memory system for bytes. Hopper's bulk prefetch (`cp.async.bulk.prefetch.L2.global`: one
instruction per CHUNK bytes, served by the copy engine, nothing returned to registers) lets a
few programs keep HBM busy while the GEMM before runs. Issued on a side stream ahead of the GEMM
that needs the bytes (codec/weight_prefetch.py), it gives that GEMM an L2 hit instead of an HBM
read. It is a hint: nothing is written, and a prefetch that comes late or is evicted changes
only the time.

MODE "bulk" issues the prefetches (sm_90 and later; CUDA only). MODE "plan" stores each chunk's
(start, size) instead: the same address arithmetic, run by the tests in Triton's interpreter
(which cannot run inline PTX), so they can check that the chunks tile the tensor exactly.
Grid and arguments depend on shapes only, nothing is read back: capturable in a CUDA graph.
"""

from __future__ import annotations

import torch

from .triton_setup import INTERPRET, jit, tl, triton

CHUNK_BYTES = 16384  # one bulk prefetch; a multiple of 16 (the instruction's granule)
BLOCK = 128  # chunks a program issues at once (one per thread at 4 warps)
NUM_PROGRAMS = 8  # few programs: the copy engine does the work, the GEMM keeps the SMs


def is_supported(t: torch.Tensor) -> bool:
    """True when a bulk prefetch can run here: triton importable, t on a CUDA device of sm_90 or
    later, its bytes one dense run (contiguous, or a contiguous matrix's transpose, as
    fused_linear.prepare_weight stores some weights), 16-byte aligned, a multiple of 16 long."""
    return _bulk_bytes(t) is not None


def _bulk_bytes(t: torch.Tensor) -> torch.Tensor | None:
    """t's bytes as the flat uint8 view the kernel reads, or None where `is_supported` is False."""
    if triton is None or INTERPRET or not t.is_cuda or torch.cuda.get_device_capability(t.device) < (9, 0):
        return None
    raw = _dense(t)
    return raw if raw is not None and t.data_ptr() % 16 == 0 and raw.numel() % 16 == 0 else None


def _dense(t: torch.Tensor) -> torch.Tensor | None:
    """t's bytes as one flat uint8 tensor, or None where they are not one dense run."""
    if t.is_contiguous():
        return t.reshape(-1).view(torch.uint8)
    if t.dim() == 2 and t.t().is_contiguous():
        return t.t().reshape(-1).view(torch.uint8)
    return None


def prefetch(t: torch.Tensor) -> None:
    """Ask for t's bytes in L2 on the current stream (a no-op where `is_supported` is False)."""
    raw = _bulk_bytes(t)
    if raw is not None and raw.numel():
        _launch(raw, None, None, "bulk")


def plan(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, sizes) in bytes of the chunks `prefetch` would ask for, computed by the kernel
    itself (MODE "plan"): what the tests check, on the interpreter or a GPU. t as `prefetch`
    takes it, on any device the kernel runs on."""
    raw = _dense(t)
    chunks = triton.cdiv(raw.numel(), CHUNK_BYTES)
    starts = torch.full((chunks,), -1, dtype=torch.int64, device=t.device)
    sizes = torch.full((chunks,), -1, dtype=torch.int32, device=t.device)
    _launch(raw, starts, sizes, "plan")
    return starts, sizes


def _launch(raw: torch.Tensor, starts, sizes, mode: str) -> None:
    """The kernel over `raw` (a tensor's bytes, _dense's view)."""
    _prefetch_kernel[(NUM_PROGRAMS,)](raw, raw.numel(), starts if starts is not None else raw,
                                      sizes if sizes is not None else raw, CHUNK=CHUNK_BYTES, BLOCK=BLOCK,
                                      MODE=mode, num_warps=4)


@jit
def _prefetch_kernel(src_ptr, nbytes, starts_ptr, sizes_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                     MODE: tl.constexpr):
    """Programs take BLOCK chunks at a time, strided by the grid; chunk c is bytes
    [c * CHUNK, min((c + 1) * CHUNK, nbytes)). The last chunk is shorter; nbytes % 16 == 0 keeps
    it whole granules."""
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    nbytes = nbytes.to(tl.int64)  # an i32 nbytes near 2**31 would overflow in cdiv
    num_chunks = tl.cdiv(nbytes, CHUNK)
    offs = tl.arange(0, BLOCK)
    for first in range(pid * BLOCK, num_chunks, num_programs * BLOCK):
        chunk = first + offs
        is_chunk = chunk < num_chunks
        start = chunk.to(tl.int64) * CHUNK
        size = tl.minimum(nbytes - start, CHUNK).to(tl.int32)
        if MODE == "bulk":
            # lanes past the last chunk skip the instruction (a predicate), rather than asking for
            # bytes past the tensor
            address = (src_ptr + tl.where(is_chunk, start, 0)).to(tl.int64)
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                "=r,l,r,r", [address, size, is_chunk.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.store(starts_ptr + chunk, start, mask=is_chunk)
            tl.store(sizes_ptr + chunk, size, mask=is_chunk)
