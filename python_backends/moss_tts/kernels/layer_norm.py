"""LayerNorm over the last dimension in one Triton pass, several rows per program.

Why not torch's: in the H200 profile of a packed 256-row codec round (perf/RESULTS.md, issue 34)
the codec's 184 LayerNorms took 5.5 ms, about three times what reading and writing their
activations costs at the H200's bandwidth. torch's kernel gives each row (768 or 1280 values in
the codec) its own block and reduces it through shared memory twice; here a program holds a few
whole rows in registers, so its loads and stores are wide and its reductions stay in warps.

The math is torch's (fp32 statistics, biased variance, rstd = rsqrt(var + eps), then
(x - mean) * rstd * gamma + beta in fp32, rounded once to x's dtype); the variance is taken
around the mean already computed (two passes over registers, no cancellation), so results
equal F.layer_norm's up to fp32 rounding order. Grid and tiles depend on shapes only and nothing
is read back to the host: capturable in CUDA graphs. Where Triton cannot run (CPU without
TRITON_INTERPRET) F.layer_norm runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .triton_setup import INTERPRET, jit, tl, triton

# Values each program holds (rows x padded width): 4 rows of the 768-wide stages, 2 of the
# 1280-wide one (padded to 2048). Enough bytes in flight per program to stream at bandwidth
# with 4 warps, few enough registers to keep occupancy.
TILE_VALUES = 4096
NUM_WARPS = 4
# Widest row the kernel takes (a whole row sits in registers); wider rows go to F.layer_norm.
MAX_WIDTH = 8192


def is_supported(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None = None) -> bool:
    """True when the Triton kernel can run here: triton importable, x on CUDA (or
    TRITON_INTERPRET=1, for CPU tests), fp16/bf16/fp32, rows of at most MAX_WIDTH values, and
    gamma / beta (when given) contiguous vectors of x's width on x's device."""
    if triton is None or not (INTERPRET or x.is_cuda):
        return False
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.numel() == 0 or x.dim() == 0:
        return False
    affine_ok = all(t is None or (t.shape == x.shape[-1:] and t.is_contiguous() and t.device == x.device)
                    for t in (weight, bias))
    return affine_ok and x.shape[-1] <= MAX_WIDTH


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float = 1e-5) -> torch.Tensor:
    """F.layer_norm(x, (x.shape[-1],), weight, bias, eps) as one Triton pass (see the module
    docstring); the torch function where the kernel cannot run."""
    if not is_supported(x, weight, bias):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    width = x.shape[-1]
    rows = x.reshape(-1, width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    block_n = triton.next_power_of_2(width)
    block_m = max(1, TILE_VALUES // block_n)
    # Absent gamma/beta: any tensor fills the argument, HAS_WEIGHT/HAS_BIAS keep it unread.
    _layer_norm_kernel[(triton.cdiv(rows.shape[0], block_m),)](
        rows, weight if weight is not None else rows, bias if bias is not None else rows, out,
        rows.shape[0], width, rows.stride(0), out.stride(0), eps,
        HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=NUM_WARPS)
    return out.view(x.shape)


@jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_x, stride_out, eps,
                       HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    """One block of BLOCK_M whole rows (N <= BLOCK_N): moments in fp32, then the affine map."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < N
    mask = (rows < M)[:, None] & in_row[None, :]
    rows64 = rows.to(tl.int64)  # rows x stride passes 2**31 in the long offline stages
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, 1) / N
    centered = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(centered * centered, 1) / N
    y = centered * tl.rsqrt(var + eps)[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=in_row, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows64[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)
