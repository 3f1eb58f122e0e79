"""fp8 (e4m3) GEMMs for the engine's backbone, opt-in (EngineConfig.fp8_weights): y = x @ W^T with
W quantized once per output channel and x quantized per row at every call, both by their
absolute maximum (the "dynamic fp8" scheme of served LLMs).

Why: at batch 256 a decode step spends ~4.1 of its ~7.9 ms in the backbone's four GEMMs a
layer, at cuBLAS's bf16 best (issue 34); Hopper's fp8 tensor cores do twice the bf16 rate and
the weights are half the bytes (at one stream the step reads 8 GB of bf16 weights a frame).

What changes against the bf16 path, and nothing else: each GEMM's two inputs are rounded to fp8
after the bf16 path has made them (x exactly as the bf16 path holds it, rounded to its dtype
first; W as loaded), and the GEMM accumulates in fp32 and scales in its epilogue
(torch._scaled_mm, row-wise scales: CUTLASS on sm_90). The SwiGLU product feeding down_proj is
made inside the quantizing kernel (`gated=True`), rounded to x's dtype as gated_silu rounds it,
so the fp8 path has no pass of its own for it. The effect on the model's outputs against fp32 is
measured by perf/bench_engine.py's fp8 section (perf/RESULTS.md), not assumed.

On CPU (tests; torch has no row-wise fp8 GEMM there) `reference_mm` dequantizes and multiplies
in fp32: the same products, summed in another order. The quantizing kernel runs on CUDA or in
Triton's interpreter; elsewhere `reference_quantize_rows`, which is also the tests' oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .triton_setup import INTERPRET, jit, tl, triton

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
MIN_AMAX = 1e-12  # an all-zero row keeps a finite scale (its codes are all 0)
BLOCK = 1024  # columns per inner-loop tile of the quantizing kernel
NUM_WARPS = 4


@dataclass(frozen=True)
class Fp8Weight:
    """W [N, K] ~= data * scale.T: data float8_e4m3fn [N, K], scale float32 [1, N] (the layout
    _scaled_mm takes for its second operand's scales)."""
    data: torch.Tensor
    scale: torch.Tensor

    @property
    def out_features(self) -> int:
        return self.data.shape[0]

    def rows(self, start: int, stop: int) -> "Fp8Weight":
        """Output channels start .. stop-1 as views (a merged projection's q, k or v part)."""
        return Fp8Weight(self.data[start:stop], self.scale[:, start:stop])


def quantize_weight(weight: torch.Tensor) -> Fp8Weight:
    """Per output channel: scale = max |W[n]| / 448, data = W[n] / scale, rounded to nearest."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(MIN_AMAX) / FP8_MAX
    data = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return Fp8Weight(data.contiguous(), scale[None, :].contiguous())


def gemm_supported(device: torch.device) -> bool:
    """Row-wise scaled fp8 GEMMs: CUDA compute capability 8.9 or 9.x (torch._scaled_mm)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


# ------------------------------------------------------------------------------------ reference
def _values(x: torch.Tensor, gated: bool) -> torch.Tensor:
    """The values the bf16 path would feed its GEMM, in fp32: x, or silu(gate) * up of the merged
    gate/up output rounded to x's dtype (gated_silu's formula and rounding)."""
    if not gated:
        return x.float()
    gate, up = x.float().chunk(2, dim=-1)
    return (gate / (1.0 + torch.exp(-gate)) * up).to(x.dtype).float()


def reference_quantize_rows(x: torch.Tensor, gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (gated: [M, 2K]) -> (codes float8_e4m3fn [M, K], scale float32 [M, 1]) with
    values ~= codes * scale; scale = max |row| / 448."""
    y = _values(x, gated)
    amax = y.abs().amax(dim=-1, keepdim=True).clamp_min(MIN_AMAX)
    # Tensor by tensor: torch divides by a Python number (either way round) through a reciprocal,
    # one rounding more than the kernel's IEEE division.
    top = torch.full_like(amax, FP8_MAX)
    codes = (y * (top / amax)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return codes, amax / top


def reference_mm(codes: torch.Tensor, scale: torch.Tensor, weight: Fp8Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """What _scaled_mm computes: fp32 products of the codes, then both scales, then one rounding."""
    acc = codes.float() @ weight.data.float().t()
    return (acc * scale * weight.scale).to(out_dtype)


# ------------------------------------------------------------------------------------ public
def quantize_rows(x: torch.Tensor, gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (gated: [M, 2K], gate first) -> (codes [M, K] fp8, scale [M, 1] fp32): one
    program a row, a pass for the row's maximum and one that writes the codes (the row is in L2
    by then). On CUDA or the interpreter; otherwise the torch reference."""
    if triton is None or not (INTERPRET or x.is_cuda) or x.dim() != 2 or x.stride(-1) != 1 \
            or x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or (gated and x.shape[1] % 2):
        return reference_quantize_rows(x, gated)
    rows, width = x.shape[0], x.shape[1] // 2 if gated else x.shape[1]
    codes = torch.empty(rows, width, device=x.device, dtype=FP8)
    scale = torch.empty(rows, 1, device=x.device, dtype=torch.float32)
    if rows:
        _quantize_kernel[(rows,)](x, codes, scale, x.stride(0), WIDTH=width, GATED=gated, BLOCK=BLOCK,
                                  QMAX=FP8_MAX, MIN_AMAX=MIN_AMAX, num_warps=NUM_WARPS)
    return codes, scale


def linear(x: torch.Tensor, weight: Fp8Weight, gated: bool = False) -> torch.Tensor:
    """x [..., K] (gated: the merged gate/up output [..., 2K]) -> [..., N] in x's dtype."""
    lead = x.shape[:-1]
    codes, scale = quantize_rows(x.reshape(-1, x.shape[-1]), gated)
    if x.is_cuda:
        # Row-wise scales take a bf16 output only (EngineConfig refuses fp8 with another dtype).
        out = torch._scaled_mm(codes, weight.data.t(), scale_a=scale, scale_b=weight.scale, out_dtype=x.dtype)
    else:
        out = reference_mm(codes, scale, weight, x.dtype)
    return out.view(*lead, weight.out_features)


class Fp8Linear(nn.Module):
    """A bias-free nn.Linear whose weight lives in fp8 (the model's own forward keeps working)."""

    def __init__(self, weight: Fp8Weight) -> None:
        super().__init__()
        self.fp8 = weight
        self.in_features, self.out_features = weight.data.shape[1], weight.data.shape[0]

    def forward(self, x: torch.Tensor, gated: bool = False) -> torch.Tensor:
        return linear(x, self.fp8, gated)


# ------------------------------------------------------------------------------------ Triton
@jit
def _row_values(x_ptr, row, cols, mask, WIDTH: tl.constexpr, GATED: tl.constexpr):
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        up = tl.load(x_ptr + row + WIDTH + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x / (1.0 + tl.exp(-x)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
    return x


@jit
def _quantize_kernel(x_ptr, codes_ptr, scale_ptr, stride_row, WIDTH: tl.constexpr, GATED: tl.constexpr,
                     BLOCK: tl.constexpr, QMAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """One row: its absolute maximum over WIDTH values, then its codes (values * 448 / max)."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid * stride_row
    amax = tl.zeros([BLOCK], tl.float32)
    for start in range(0, WIDTH, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(_row_values(x_ptr, row, cols, cols < WIDTH, WIDTH, GATED)))
    top = tl.maximum(tl.max(amax, 0), MIN_AMAX)
    inv = tl.math.div_rn(QMAX, top)  # IEEE division, as the reference's
    tl.store(scale_ptr + pid, tl.math.div_rn(top, QMAX))
    for start in range(0, WIDTH, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < WIDTH
        y = _e4m3_grid(_row_values(x_ptr, row, cols, mask, WIDTH, GATED) * inv)
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
        tl.store(codes_ptr + pid * WIDTH + cols, y.to(codes_ptr.dtype.element_ty), mask=mask)


@jit
def _e4m3_grid(y):
    """y (fp32) rounded to the nearest e4m3 value, ties to even, still in fp32: the cast after it
    is then exact. Rounded here rather than by the cast because Triton's interpreter rounds its
    fp8 casts its own way (up to 7 steps off in a test), and the CPU tests must see the GPU's
    codes. Normal range (|y| >= 2^-6): keep 3 mantissa bits of the fp32 pattern, rounding on the
    bits dropped; below it e4m3 is subnormal, multiples of 2^-9: adding and taking away 1.5 x
    2^14 rounds y to those in fp32's own round-to-nearest-even."""
    bits = y.to(tl.int32, bitcast=True)
    bits = (bits + (0x7FFFF + ((bits >> 20) & 1))) & -1048576  # -1048576 = 0xFFF00000: sign, exponent, 3 bits
    normal = bits.to(tl.float32, bitcast=True)
    size = tl.abs(y)
    tiny = (size + 24576.0) - 24576.0
    tiny = tl.where(y < 0, -tiny, tiny)  # on the magnitude, so a small negative value ends as -0, as a cast does
    return tl.where(size < 0.015625, tiny, normal)
