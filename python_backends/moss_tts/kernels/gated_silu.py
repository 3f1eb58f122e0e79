"""SiLU and SiLU-gated products of a decode step as plain Triton kernels.

torch.compile(dynamic=True) made these two pointwise passes from the fused-function set: the
backbone's silu(gate) * up over the merged gate/up output [B, 2 x 9728] and the local frame's
silu over fc_in's output [B, 9728]. At batch 256 the H200 profile (2026-12-03) gave them 12.8 and
12.6 µs a call, 36 + 12 calls a step: 0.6 ms, where their bytes (10-15 MB, most of it still in
L2 from the GEMM before) take 3-4 µs. The dynamic-shape kernels index with a runtime width (an
integer division per element, no vector loads); here the width is a compile-time constant and
each program covers one row's block of columns.

Same math as the compiled chains (fp32 throughout, rounded once at the store); CPU tensors and
shapes the kernels do not cover take the torch functions of kernels/fused.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .triton_setup import INTERPRET, jit, tl, triton

BLOCK = 1024  # columns per program
NUM_WARPS = 4


def _runs_here(x: torch.Tensor) -> bool:
    return (triton is not None and (INTERPRET or x.is_cuda) and x.stride(-1) == 1
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32))


def silu_mul_merged(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of the merged projection's output [..., 2 N] (gate first) -> [..., N]."""
    if not _runs_here(gate_up) or gate_up.shape[-1] % 2:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    rows = gate_up.reshape(-1, gate_up.shape[-1])
    width = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], width, device=gate_up.device, dtype=gate_up.dtype)
    _silu_kernel[(rows.shape[0], triton.cdiv(width, BLOCK))](
        rows, out, rows.stride(0), WIDTH=width, GATED=True, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out


def silu(x: torch.Tensor) -> torch.Tensor:
    """F.silu(x) of [..., N]."""
    if not _runs_here(x):
        return F.silu(x)
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _silu_kernel[(rows.shape[0], triton.cdiv(x.shape[-1], BLOCK))](
        rows, out, rows.stride(0), WIDTH=x.shape[-1], GATED=False, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out


@jit
def _silu_kernel(x_ptr, out_ptr, stride_row, WIDTH: tl.constexpr, GATED: tl.constexpr, BLOCK: tl.constexpr):
    """One (row, block of columns): out = silu(x[:WIDTH]) (* x[WIDTH:2 WIDTH] when GATED)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    x = tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    y = x / (1.0 + tl.exp(-x))
    if GATED:
        y = y * tl.load(x_ptr + row * stride_row + WIDTH + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * WIDTH + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
