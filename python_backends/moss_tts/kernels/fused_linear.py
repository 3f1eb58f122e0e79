"""The codec's projections with their LayerNorm, GELU or residual add inside the GEMM:
y = gelu?(norm?(x) @ W^T), or r += x @ W^T in place (the residual stream r, as addmm_ with beta 1).

A codec layer runs LayerNorm -> in_proj and LayerNorm -> ffn[0] -> GELU; torch spends a
bandwidth-bound kernel on each norm and on the GELU, each reading and writing a full activation
(H200 profile of a codec step: 17.7 of 85 ms, 40% as much as its GEMMs). Here one Triton GEMM
does all of it:
- LayerNorm prologue: a program first reads its BLOCK_M rows of x once for their moments (fp32,
  Welford per tile merged with Chan's formula, biased variance, rstd = 1/sqrt(var + eps), as
  torch's kernel computes them), then normalizes each A tile of the main loop in fp32
  (gamma * ((a - mean) * rstd) + beta, torch's order) and ROUNDS it to x's dtype before tl.dot,
  so the GEMM multiplies the very values F.layer_norm would have written, up to fp32 rounding;
- exact (erf) GELU on the fp32 accumulator, as nn.GELU(), then one rounding to x's dtype (torch
  rounds the linear output first, then the GELU: the two differ by one rounding); or, with
  approximate="tanh", the tanh form (F.gelu's), as the served fusions' cuBLASLt epilogue computes
  it, so a codec layer computes one function whichever of the two runs its step;
- residual epilogue: the program adds its tile of r (fp32) to the accumulator and stores the sum
  back into r, one rounding, as cuBLAS does for the serving form's addmm_ (beta = 1) into the
  residual stream. Each program reads and writes only its own tile, so in place is safe; x must
  not overlap r.
Split-K (GemmConfig.split_k > 1; only where the table or a caller asks): a few-token GEMM with a
narrow output (the residual GEMMs: N = d) has too few tiles to keep HBM busy while reading W, so
split_k programs share each tile's K range; their fp32 partials meet in a workspace and the last
to arrive sums them in a fixed order and runs the epilogue, in the same kernel (no reduce kernel
of its own, as cuBLAS's split-K has). The LayerNorm's moments are taken over the whole row by
every share (x is a few rows).
Why a residual epilogue (issue 34): at a few tokens a stage (a 1-row x 2-frame step: 2-64 rows)
every codec GEMM is bound by latency, not by its FLOPs, and the layer is ~10 graph nodes (two
LayerNorms, four cuBLAS GEMMs, each residual GEMM with a split-K reduce of its own). Run as four
of these kernels (norm1+in_proj, out_proj+residual, norm2+ffn[0]+GELU, ffn[2]+residual) the
layer is seven nodes with the attention's three (codec.transformer, `small_gemm_rows`).
What the norm costs on Hopper (from the sm_90 TTGIR; H200 timings in bench_codec_gemm.py): the
normalized tile reaches wgmma from registers, and Triton 3.6 cannot move the shared-to-register
layout conversion above the rounding, so each A tile makes one extra round trip through shared
memory (the wgmmas stay asynchronous); the moments pass is pipelined but runs before the GEMM.
W is read through both its strides, so nn.Linear's [N, K] works as stored; `prepare_weight`
repacks it once (same shape and values, N contiguous), the layout for which ptxas keeps the
wgmma pipeline asynchronous at 128x256 tiles (with W K-contiguous it reports the wgmmas
serialized, C7515). Tiles come from a small explicit table (`gemm_config`), never from run-time
autotuning: the server captures CUDA graphs and must not benchmark at start-up. Grid and
allocation depend on shapes only, nothing is read back to the host: capturable. On CPU (no
Triton) `reference_fused_linear` runs; it is also the tests' oracle.

Where it runs (codec.transformer): the `gelu` / `norm_gelu` fusions (every step; slower than
cuBLAS on the H200 at large steps, so not served) and the small-GEMM path (`small_gemm_rows`:
steps of a few tokens, all four GEMMs of a layer; off: measured slower than cuBLAS's chain, which
reads these weights faster, e.g. 8.0 µs a call against ~5; perf/RESULTS.md, issue 34 round 21).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .triton_setup import INTERPRET, jit, tl, triton

# Over 300 lines (a kernel file): the kernel, its epilogue and moments helpers, its launcher with
# the tile table and the split-K counters, and the torch reference the CPU runs and the tests
# compare against share one contract (norm prologue, GELU forms, residual add, split-K); apart,
# each file would restate it.


@dataclass(frozen=True)
class GemmConfig:
    block_m: int  # rows of x per program (wgmma: a multiple of 64 per 4 warps)
    block_n: int  # output columns per program
    block_k: int  # reduction step, also the LayerNorm moments' step
    num_warps: int
    num_stages: int
    group_m: int = 8  # row blocks that share one sweep over W's column blocks (L2 reuse of W)
    # Programs that share one output tile's K (module docstring, "Split-K"); 1 = none
    split_k: int = 1

    def __post_init__(self):
        if self.split_k < 1:
            raise ValueError(f"GemmConfig: split_k must be >= 1, got {self.split_k}")

    def __str__(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages}"
                f" g{self.group_m}" + (f" k{self.split_k}" if self.split_k > 1 else ""))


# (most rows, tiles) per kernel kind, first match wins. Provisional until an H200 sweep
# (perf/bench_codec_gemm.py --sweep prints a table to paste here); chosen from what ptxas reports
# for sm_90 with W prepared (N-contiguous): no spills and no serialized wgmma.
# - Few rows (a step's first stage): reading W bounds the time, so narrow column tiles spread it
#   over more SMs.
# - Many rows, plain: 128x256, the widest tile that fits (8 warps: 128 fp32 accumulators each).
# - Many rows, norm: the normalized A tile lives in registers beside the accumulators; at 128x256
#   ptxas spills (with GELU) or serializes the wgmmas (without), at 128x128 it does neither. A
#   BLOCK_K of 128 serializes them too (64 rows and 128).
# - At most 16 rows (the small-GEMM path's first stages): 16-row tiles (mma.sync; wgmma needs 64
#   rows a warpgroup), so 48 of every 64 tile rows are not padding; 32-column tiles for twice the
#   programs over W. Provisional as well: bench_codec_gemm.py --sweep times them.
CONFIG_TABLE: dict[str, tuple[tuple[int, GemmConfig], ...]] = {
    "plain": ((16, GemmConfig(16, 32, 128, 4, 4)),
              (64, GemmConfig(64, 64, 128, 4, 4)),
              (1024, GemmConfig(128, 128, 64, 8, 4)),
              (2**62, GemmConfig(128, 256, 64, 8, 3))),
    "norm": ((16, GemmConfig(16, 32, 64, 4, 4)),
             (64, GemmConfig(64, 64, 64, 4, 4)),
             (2**62, GemmConfig(128, 128, 64, 8, 3))),
}


def kernel_kind(has_norm: bool) -> str:
    return "norm" if has_norm else "plain"


def gemm_config(num_rows: int, has_norm: bool) -> GemmConfig:
    """The table's tiles for a call with num_rows rows of x (the tokens of a step)."""
    return next(config for most, config in CONFIG_TABLE[kernel_kind(has_norm)] if num_rows <= most)


def fused_linear(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
                 norm_bias: torch.Tensor | None = None, eps: float = 1e-5, gelu: bool = False,
                 config: GemmConfig | None = None, residual: torch.Tensor | None = None,
                 approximate: str = "none") -> torch.Tensor:
    """x [..., K], weight [N, K] (nn.Linear's, bias-free) -> [..., N] in x's dtype:
    gelu?(layer_norm?(x) @ weight^T). The LayerNorm (over K) runs when norm_weight is given
    (norm_bias with it, as nn.LayerNorm keeps both); gelu is the exact erf form, or F.gelu's tanh
    form with approximate="tanh". With `residual`
    ([..., N] like the output, contiguous, x's dtype, not overlapping x) the product is added to
    it in place and `residual` is returned (no GELU then). `config` overrides the table's tiles
    (benchmarks, tests)."""
    _check_norm(norm_weight, norm_bias)
    _check_residual(x, weight, gelu, residual)
    _check_approximate(approximate)
    if is_supported(x, weight):
        return _triton_fused_linear(x, weight, norm_weight, norm_bias, eps, gelu, config, residual, approximate)
    return reference_fused_linear(x, weight, norm_weight, norm_bias, eps, gelu, residual, approximate)


def is_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when the Triton kernel can run here: triton importable, tensors on CUDA (or
    TRITON_INTERPRET=1, for CPU tests), one dtype of fp16/bf16/fp32, x K-contiguous and W
    contiguous along K (as nn.Linear stores it) or along N (`prepare_weight`)."""
    if triton is None or not (INTERPRET or x.is_cuda):
        return False
    dtypes_ok = x.dtype == weight.dtype and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
    shapes_ok = weight.dim() == 2 and x.shape[-1] == weight.shape[1]
    return dtypes_ok and shapes_ok and x.stride(-1) == 1 and 1 in weight.stride()


def prepare_weight(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] with the same values stored N-contiguous (strides (1, N)): the kernel's faster
    layout (module docstring). Once, at the serving form; F.linear and addmm read it as well."""
    return weight.t().contiguous().t()


def _check_norm(norm_weight, norm_bias) -> None:
    if (norm_weight is None) != (norm_bias is None):
        raise ValueError("fused_linear: give the LayerNorm's weight and bias together (nn.LayerNorm keeps both), "
                         "or neither for no norm")


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"fused_linear: approximate must be 'none' (exact GELU) or 'tanh', got {approximate!r}")


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses a tensor's elements span, whatever its strides."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _check_residual(x, weight, gelu, residual) -> None:
    if residual is None:
        return
    if gelu:
        raise ValueError("fused_linear: a residual add takes no GELU (the codec adds the GEMM's output as it is)")
    if residual.shape != (*x.shape[:-1], weight.shape[0]) or residual.dtype != x.dtype or not residual.is_contiguous():
        raise ValueError(f"fused_linear: residual must be contiguous {x.dtype} of shape {(*x.shape[:-1], weight.shape[0])}, "
                         f"got {residual.dtype} {tuple(residual.shape)}")
    (x_start, x_end), (r_start, r_end) = _extent(x), _extent(residual)
    if x.numel() and residual.numel() and x_start < r_end and r_start < x_end:
        raise ValueError("fused_linear: x overlaps the residual it is added to")


# ------------------------------------------------------------------------------------ reference
def reference_fused_linear(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
                           norm_bias: torch.Tensor | None = None, eps: float = 1e-5,
                           gelu: bool = False, residual: torch.Tensor | None = None,
                           approximate: str = "none") -> torch.Tensor:
    """Same contract in plain torch, the modules' own ops (with `residual`: the serving form's
    addmm_ into it): the CPU path and the tests' oracle."""
    _check_norm(norm_weight, norm_bias)
    _check_residual(x, weight, gelu, residual)
    _check_approximate(approximate)
    if norm_weight is not None:
        x = F.layer_norm(x, (x.shape[-1],), norm_weight, norm_bias, eps)
    if residual is not None:
        residual.view(-1, weight.shape[0]).addmm_(x.reshape(-1, x.shape[-1]), weight.t())
        return residual
    y = F.linear(x, weight)
    return F.gelu(y, approximate=approximate) if gelu else y


# ------------------------------------------------------------------------------------ Triton
MAX_SPLIT_TILES = 1 << 16  # output tiles a split-K call may have (the arrival counters per device)
_ARRIVALS: dict[torch.device, torch.Tensor] = {}


def _arrivals(device: torch.device, tiles: int) -> torch.Tensor:
    """The device's split-K arrival counters, int32 zeros that every call leaves at zero. Made at a
    device's first split-K call, which must not be under CUDA-graph capture (the codec runs every
    step shape once before capturing it). One per device: split-K calls on one device must not run
    on two streams at once (the codec's GEMMs run on the vocoder's stream only)."""
    if tiles > MAX_SPLIT_TILES:
        raise ValueError(f"fused_linear: split-K over {tiles} output tiles, more than {MAX_SPLIT_TILES}")
    counters = _ARRIVALS.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("fused_linear: the first split-K call on a device must run outside CUDA-graph capture")
        counters = _ARRIVALS[device] = torch.zeros(MAX_SPLIT_TILES, dtype=torch.int32, device=device)
    return counters


def _triton_fused_linear(x, weight, norm_weight, norm_bias, eps, gelu, config: GemmConfig | None, residual,
                         approximate):
    n, k = weight.shape
    rows = x.reshape(-1, k)  # a view for the codec's contiguous activations
    m = rows.shape[0]
    out = rows.new_empty(m, n) if residual is None else residual.view(m, n)
    if m == 0:
        return out.view(*x.shape[:-1], n) if residual is None else residual
    has_norm = norm_weight is not None
    c = config or gemm_config(m, has_norm)
    tiles = triton.cdiv(m, c.block_m) * triton.cdiv(n, c.block_n)
    gamma, beta = (norm_weight, norm_bias) if has_norm else (weight, weight)  # never read without the norm
    if c.split_k > 1:
        partials, arrivals = rows.new_empty(c.split_k, m, n, dtype=torch.float32), _arrivals(rows.device, tiles)
    else:  # never read
        partials, arrivals = out, out
    _fused_linear_kernel[(tiles, c.split_k)](
        rows, weight, out, gamma, beta, partials, arrivals, m, n, k, rows.stride(0), weight.stride(1),
        weight.stride(0), out.stride(0), eps, HAS_NORM=has_norm, HAS_GELU=gelu, GELU_TANH=approximate == "tanh",
        HAS_RESIDUAL=residual is not None, EVEN_K=k % c.block_k == 0, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        BLOCK_K=c.block_k, GROUP_M=c.group_m, SPLIT_K=c.split_k, num_warps=c.num_warps, num_stages=c.num_stages)
    return out.view(*x.shape[:-1], n) if residual is None else residual


@jit
def _fused_linear_kernel(x_ptr, w_ptr, y_ptr, gamma_ptr, beta_ptr, partials_ptr, arrivals_ptr, M, N, K, stride_xm,
                         stride_wk, stride_wn, stride_ym, eps, HAS_NORM: tl.constexpr, HAS_GELU: tl.constexpr,
                         GELU_TANH: tl.constexpr, HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of y, programs in grouped order: GROUP_M row blocks walk the
    column blocks together, so the W columns they share are read from L2, not HBM. W is read
    through both strides: Triton specializes a stride of 1, so either layout gets its own code."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_rows
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_rows

    # Rows and columns past the edge wrap around to real ones, so the main loop's loads need no
    # row/column mask (their results are never stored); `%` rather than a clamp keeps the column
    # offsets provably contiguous for vector loads. Row offsets in int64: M x K passes 2**31 at
    # ~1.7 M tokens of d=1280.
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + (offs_m % M).to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    w_cols = w_ptr + (offs_n % N)[None, :] * stride_wn  # [1, BLOCK_N]

    if HAS_NORM:
        mean, rstd = _row_moments(x_rows, K, eps, EVEN_K, BLOCK_M, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SPLIT_K == 1:
        k_lo = 0
        k_hi = K
    else:  # this program's share of K, whole BLOCK_K tiles (the last shares may be short or empty)
        share = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_lo = tl.program_id(1) * share
        k_hi = tl.minimum(K, k_lo + share)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + offs_k
        if EVEN_K:
            a = tl.load(x_rows + k[None, :])
            b = tl.load(w_cols + k[:, None] * stride_wk)
        else:  # zeros past K in both operands add nothing
            a = tl.load(x_rows + k[None, :], mask=(k < K)[None, :], other=0.0)
            b = tl.load(w_cols + k[:, None] * stride_wk, mask=(k < K)[:, None], other=0.0)
        if HAS_NORM:
            # gamma and beta read as 0 past K, so the normalized padding is 0 too
            gamma = tl.load(gamma_ptr + k, mask=k < K, other=0.0).to(tl.float32)
            beta = tl.load(beta_ptr + k, mask=k < K, other=0.0).to(tl.float32)
            normed = gamma[None, :] * ((a.to(tl.float32) - mean[:, None]) * rstd[:, None]) + beta[None, :]
            a = normed.to(x_ptr.dtype.element_ty)  # the values F.layer_norm would have stored
        acc = tl.dot(a, b, acc, input_precision="ieee")  # "ieee": fp32 stays fp32, as in torch

    y = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
    in_bounds = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        _finish(acc, y, in_bounds, HAS_GELU, GELU_TANH, HAS_RESIDUAL)
    else:
        # Each share's partial sum to the workspace; the share that arrives last at this tile adds
        # them in share order (the same sum whichever arrives last: deterministic, so graphed ==
        # eager bit for bit), finishes the tile and resets the tile's arrival count to 0 for the
        # next call. The barrier, then one release-acquire atomic, make every thread's partial
        # visible to the last share (CUTLASS's semaphore pattern); its loads bypass L1 (.cg).
        tile = (offs_m.to(tl.int64)[:, None] * N + offs_n[None, :])
        tl.store(partials_ptr + tl.program_id(1) * M * N + tile, acc, mask=in_bounds)
        tl.debug_barrier()
        arrived = tl.atomic_add(arrivals_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for share_index in range(SPLIT_K):
                total += tl.load(partials_ptr + share_index * M * N + tile, mask=in_bounds, other=0.0,
                                 cache_modifier=".cg")
            _finish(total, y, in_bounds, HAS_GELU, GELU_TANH, HAS_RESIDUAL)
            tl.atomic_xchg(arrivals_ptr + pid, 0, sem="relaxed", scope="gpu")


@jit
def _finish(acc, y, in_bounds, HAS_GELU: tl.constexpr, GELU_TANH: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The tile's epilogue on its fp32 sum: the GELU, or the residual add, and one rounding."""
    if HAS_GELU and GELU_TANH:
        # F.gelu(approximate="tanh"): 0.5 y (1 + tanh(u)) with u = sqrt(2 / pi) (y + 0.044715 y^3),
        # which is y * sigmoid(2u) exactly (tl has no tanh; no 1 + tanh cancellation this way)
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc * tl.sigmoid(2.0 * inner)
    elif HAS_GELU:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))  # erf(y / sqrt(2))
    if HAS_RESIDUAL:  # y is the residual stream: this program's tile, read then written
        acc += tl.load(y, mask=in_bounds, other=0.0).to(tl.float32)
    tl.store(y, acc.to(y.dtype.element_ty), mask=in_bounds)


@jit
def _row_moments(x_rows, K, eps, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Mean and 1/sqrt(biased var + eps) [BLOCK_M] fp32 of the rows over K. Each tile's own mean
    and squared deviations are exact two-pass sums; tiles merge by Chan's formula, so a row mean
    far from zero does not cancel its variance away (no E[x^2] - E[x]^2)."""
    offs_k = tl.arange(0, BLOCK_K)
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=3):  # asked for: a loop without tl.dot is not pipelined
        k = k0 + offs_k
        if EVEN_K:
            a = tl.load(x_rows + k[None, :]).to(tl.float32)
            count = BLOCK_K * 1.0
            tile_mean = tl.sum(a, 1) / count
            dev = a - tile_mean[:, None]
        else:
            valid = (k < K)[None, :]
            a = tl.load(x_rows + k[None, :], mask=valid, other=0.0).to(tl.float32)
            count = tl.minimum(K - k0, BLOCK_K) * 1.0
            tile_mean = tl.sum(a, 1) / count
            dev = tl.where(valid, a - tile_mean[:, None], 0.0)
        seen = k0 * 1.0
        total = seen + count
        delta = tile_mean - mean
        mean += delta * (count / total)
        m2 += tl.sum(dev * dev, 1) + delta * delta * (seen * count / total)
    rstd = tl.math.rsqrt(m2 / K + eps)  # torch: rsqrtf (compat::rsqrt), the same instruction
    return mean, rstd
