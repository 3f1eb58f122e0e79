"""The codec's fused LayerNorm -> GEMM -> GELU kernel against its torch reference.

On CPU through Triton's interpreter (tiny shapes with ragged edges, one subprocess, since
TRITON_INTERPRET must be set before triton is imported), and on a GPU at the codec's real
shapes in bf16, where it must be as accurate as torch's own LayerNorm -> cuBLAS -> GELU chain.
That it compiles for the H200 without spills is test_kernel_compile.py's job.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from moss_tts.kernels.fused_linear import (GemmConfig, fused_linear, gemm_config, is_supported, prepare_weight,
                                           reference_fused_linear)
from triton_interpreter import interpreter_json, relative_error

INTERPRETER_TIMEOUT_S = 300
SMALL = GemmConfig(16, 32, 32, num_warps=4, num_stages=2, group_m=2)  # tl.dot needs blocks >= 16

# name -> (rows M, K, N, tiles or None for the table's, x mean, N-major weight). Every edge is
# ragged somewhere: M, N and (where K % BLOCK_K != 0) K are not multiples of their blocks.
INTERPRETER_CASES = {
    "ragged_m": (37, 64, 96, SMALL, 0.0, False),
    "ragged_k": (37, 80, 96, SMALL, 0.0, False),
    "ragged_n": (37, 64, 40, SMALL, 0.0, False),
    "two_rows": (2, 64, 48, SMALL, 0.0, False),
    "groups_of_three": (70, 32, 64, GemmConfig(16, 16, 16, 4, 2, group_m=3), 0.0, False),
    "n_major_weight": (37, 80, 96, SMALL, 0.0, True),
    "mean_far_from_zero": (37, 64, 96, SMALL, 1000.0, False),  # moments without cancellation
    "table_tiles": (37, 64, 96, None, 0.0, True),  # 64-row tiles, K < BLOCK_K
    "table_small_tiles": (9, 64, 40, None, 0.0, False),  # 16-row tiles (a few tokens), nn.Linear's layout
    # split-K: three shares of one K tile each; four shares of 3 ragged K tiles (the last share empty)
    "split_k": (9, 96, 40, GemmConfig(16, 16, 32, 4, 2, split_k=3), 0.0, False),
    "split_k_ragged": (37, 80, 96, GemmConfig(16, 32, 32, 4, 2, split_k=4), 0.0, True),
}
# mode -> (LayerNorm prologue, GELU epilogue, residual epilogue)
MODES = {"plain": (False, False, False), "norm": (True, False, False), "norm_gelu": (True, True, False),
         "gelu": (False, True, False), "residual": (False, False, True), "norm_residual": (True, False, True),
         "norm_gelu_tanh": (True, True, False)}
TANH_MODES = ("norm_gelu_tanh",)  # F.gelu(approximate="tanh"), as the served cuBLASLt epilogue
FP32_TOLERANCE = 1e-5  # max |diff| / max |reference|: fp32 on both sides, only the order of sums differs
# Rows around 1000 with std 2: fp32 resolves x to 6e-5 there, so two correct ways of summing
# differ by ~4e-5; the moments as E[x^2] - E[x]^2 would be off by ~3e-2 (cancellation).
FAR_MEAN_TOLERANCE = 1e-4


def make_inputs(m, k, n, mean=0.0, dtype=torch.float32, device="cpu", seed=0):
    """x [m, k] (std 2 around `mean`), W [n, k] ~ 1/sqrt(k), LayerNorm weight and bias."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 2 + mean
    weight = torch.randn(n, k, generator=gen) / k ** 0.5
    gamma = 1 + 0.2 * torch.randn(k, generator=gen)
    beta = 0.2 * torch.randn(k, generator=gen)
    return tuple(t.to(device, dtype) for t in (x, weight, gamma, beta))


def make_residual(m, n, dtype=torch.float32, seed=1):
    return (torch.randn(m, n, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


def case_error(case, mode: str, dtype=torch.float32) -> float:
    """The kernel against the torch reference; with a residual, against addmm_ into a copy of it,
    and the kernel must have written the sum into the residual it was given (in place)."""
    m, k, n, config, mean, n_major = case
    has_norm, gelu, has_residual = MODES[mode]
    x, weight, gamma, beta = make_inputs(m, k, n, mean, dtype)
    norm = (gamma, beta) if has_norm else (None, None)
    if n_major:
        weight = prepare_weight(weight)
    assert is_supported(x, weight)
    residual = make_residual(m, n, dtype) if has_residual else None
    approximate = "tanh" if mode in TANH_MODES else "none"
    expected = reference_fused_linear(x, weight, *norm, 1e-5, gelu,
                                      None if residual is None else residual.clone(), approximate)
    got = fused_linear(x, weight, *norm, 1e-5, gelu, config, residual, approximate)
    assert got.shape == (m, n) and got.dtype == dtype
    assert residual is None or got is residual
    return relative_error(got, expected)


def fp16_ulps(case) -> float:
    """LayerNorm + GELU in fp16: the largest distance, in fp16 ulps of the result, from an oracle
    that rounds the normalized activations to fp16 (as F.layer_norm stores them) and then computes
    in fp32 with one final rounding, as the kernel does."""
    m, k, n, config, mean, n_major = case
    x, weight, gamma, beta = make_inputs(m, k, n, mean, torch.float16)
    got = fused_linear(x, weight, gamma, beta, 1e-5, True, config)
    normed = F.layer_norm(x.float(), (k,), gamma.float(), beta.float(), 1e-5).half().float()
    expected = F.gelu(normed @ weight.float().t()).half()
    spacing = np.spacing(np.abs(expected.numpy()))
    return float((np.abs(got.float().numpy() - expected.float().numpy()) / spacing).max())


def interpreter_main() -> None:
    from moss_tts.kernels import fused_linear as fl
    errors = {f"{name}/{mode}": case_error(case, mode) for name, case in INTERPRETER_CASES.items() for mode in MODES}
    errors.update({f"{name}/fp16_ulps": fp16_ulps(INTERPRETER_CASES[name]) for name in ("ragged_m", "ragged_k")})
    # every split-K call leaves its arrival counters at zero for the next
    errors["split_k_arrivals_left"] = sum(int(c.abs().sum()) for c in fl._ARRIVALS.values())
    errors["split_k_calls_made"] = len(fl._ARRIVALS)
    print(json.dumps(errors))


@pytest.fixture(scope="module")
def interpreter_errors() -> dict[str, float]:
    return interpreter_json("test_fused_linear", INTERPRETER_TIMEOUT_S)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(INTERPRETER_CASES))
def test_interpreter_kernel_matches_reference(interpreter_errors, name, mode):
    tolerance = FAR_MEAN_TOLERANCE if name == "mean_far_from_zero" else FP32_TOLERANCE
    assert interpreter_errors[f"{name}/{mode}"] <= tolerance


def test_interpreter_split_k_leaves_its_counters_at_zero(interpreter_errors):
    assert interpreter_errors["split_k_calls_made"] == 1 and interpreter_errors["split_k_arrivals_left"] == 0


# No bf16 case on the interpreter: Triton 3.6's interpreter multiplies bf16 tl.dot operands as
# their raw bits (see test_decode_attention.py); fp16 checks the rounding of the normalized tile.
@pytest.mark.parametrize("name", ["ragged_m", "ragged_k"])
def test_interpreter_fp16_rounds_like_layer_norm_then_once(interpreter_errors, name):
    assert interpreter_errors[f"{name}/fp16_ulps"] <= 1.0  # only the final rounding may differ


# ------------------------------------------------------------------ CPU contract
def test_cpu_falls_back_to_the_reference():
    x, weight, gamma, beta = make_inputs(5, 16, 8)
    assert not is_supported(x, weight)  # no TRITON_INTERPRET in this process, no GPU
    assert torch.equal(fused_linear(x, weight, gamma, beta, gelu=True),
                       F.gelu(F.linear(F.layer_norm(x, (16,), gamma, beta, 1e-5), weight)))


def test_prepared_weight_has_the_same_values():
    weight = make_inputs(1, 16, 8)[1]
    prepared = prepare_weight(weight)
    assert torch.equal(prepared, weight) and prepared.stride() == (1, 8)


def test_norm_weight_without_bias_is_refused():
    x, weight, gamma, _ = make_inputs(5, 16, 8)
    with pytest.raises(ValueError, match="together"):
        fused_linear(x, weight, gamma)


def test_the_table_covers_every_row_count():
    for rows in (1, 16, 17, 64, 65, 1024, 1025, 10**7):
        for has_norm in (False, True):
            assert gemm_config(rows, has_norm).block_m in (16, 64, 128)
            assert gemm_config(rows, has_norm).block_m >= min(rows, 64)  # a tile covers a few tokens at once


def test_residual_on_the_cpu_is_addmm_into_it_in_place():
    x, weight, gamma, beta = make_inputs(5, 16, 8)
    residual = make_residual(5, 8)
    expected = residual.clone().addmm_(F.layer_norm(x, (16,), gamma, beta, 1e-5), weight.t())
    got = fused_linear(x, weight, gamma, beta, residual=residual)
    assert got is residual and torch.equal(got, expected)


def test_a_bad_residual_is_refused_with_what_to_fix():
    x, weight, _, _ = make_inputs(5, 16, 8)
    with pytest.raises(ValueError, match="no GELU"):
        fused_linear(x, weight, gelu=True, residual=make_residual(5, 8))
    with pytest.raises(ValueError, match=r"shape \(5, 8\)"):
        fused_linear(x, weight, residual=make_residual(5, 9))
    with pytest.raises(ValueError, match="contiguous"):
        fused_linear(x, weight, residual=make_residual(8, 5).t())
    with pytest.raises(ValueError, match="torch.float32"):
        fused_linear(x, weight, residual=make_residual(5, 8, torch.float16))
    shared = torch.zeros(5, 24)
    with pytest.raises(ValueError, match="overlaps"):  # x and the residual in one buffer
        fused_linear(shared[:, :16], weight, residual=shared.view(-1)[:40].view(5, 8))
    with pytest.raises(ValueError, match="overlaps"):  # past x's numel but inside its strided rows
        fused_linear(shared[:, :16], weight, residual=shared.view(-1)[80:120].view(5, 8))
    fused_linear(shared[:, :16], weight, residual=torch.zeros(5, 8))  # apart: fine
    with pytest.raises(ValueError, match="approximate must be"):
        fused_linear(x, weight, gelu=True, approximate="fast")


# ------------------------------------------------------------------ GPU, the codec's shapes, bf16
# (d, ff): the first decoder stage and the five after it. Row counts: a few tokens, one table
# regime each, and a ragged large one.
CODEC_SHAPES = [(1280, 5120), (768, 3072)]
GPU_ROWS = [2, 640, 10_001]
# Torch rounds the GEMM output to bf16 and then the GELU's; the kernel rounds once. So the two
# differ by up to ~1.5 bf16 ulps at the largest output, 2^-7 of it relative; 2^-6 leaves room
# for the rare normalized value that rounds to the neighbouring bf16 (fp32 op order).
BF16_TOLERANCE = 2 ** -6
ACCURACY_SLACK = 1.1  # mean error vs the fp32 oracle, kernel over torch


def codec_case(d, ff, mode, rows, n_major=True):
    """The kernel's inputs for one of the layer's GEMMs: (x, weight, norm, gelu)."""
    has_norm, gelu, _ = MODES[mode]
    k, n = (ff, d) if mode == "plain" else (d, 3 * d if mode == "norm" else ff)  # plain: ffn[2]'s shape
    x, weight, gamma, beta = make_inputs(rows, k, n, dtype=torch.bfloat16, device="cuda")
    weight = prepare_weight(weight) if n_major else weight
    return x, weight, (gamma, beta) if has_norm else (None, None), gelu


@pytest.mark.gpu
@pytest.mark.parametrize("n_major", [True, False])
@pytest.mark.parametrize("rows", GPU_ROWS)
@pytest.mark.parametrize("mode", ["norm", "norm_gelu", "plain"])
@pytest.mark.parametrize("d, ff", CODEC_SHAPES)
def test_gpu_bf16_matches_torch_and_is_as_accurate(d, ff, mode, rows, n_major):
    x, weight, norm, gelu = codec_case(d, ff, mode, rows, n_major)
    got = fused_linear(x, weight, *norm, 1e-5, gelu)
    torch_chain = reference_fused_linear(x, weight, *norm, 1e-5, gelu)
    assert relative_error(got, torch_chain) <= BF16_TOLERANCE
    # The oracle: F.layer_norm's bf16 output, then everything in fp32.
    normed = x if norm[0] is None else F.layer_norm(x, (x.shape[-1],), *norm, 1e-5)
    exact = normed.float() @ weight.float().t()
    exact = F.gelu(exact) if gelu else exact
    kernel_error = (got.float() - exact).abs().mean().item()
    torch_error = (torch_chain.float() - exact).abs().mean().item()
    assert kernel_error <= ACCURACY_SLACK * torch_error, (kernel_error, torch_error)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [2, 16, 64, 640])
@pytest.mark.parametrize("d, ff", CODEC_SHAPES)
def test_gpu_bf16_residual_add_matches_addmm_and_is_as_accurate(d, ff, rows):
    """ffn[2] + residual in nn.Linear's layout, as the small-GEMM path runs it, against the serving
    form's addmm_ (cuBLAS, beta = 1): one rounding of the fp32 sum on both sides."""
    x, weight, _, _ = codec_case(d, ff, "plain", rows, n_major=False)
    residual = make_residual(rows, d, torch.bfloat16).cuda()
    torch_sum = residual.clone().addmm_(x, weight.t())
    got = fused_linear(x, weight, residual=residual)
    assert got is residual and relative_error(got, torch_sum) <= BF16_TOLERANCE
    exact = make_residual(rows, d, torch.bfloat16).cuda().float() + x.float() @ weight.float().t()
    kernel_error = (got.float() - exact).abs().mean().item()
    torch_error = (torch_sum.float() - exact).abs().mean().item()
    assert kernel_error <= ACCURACY_SLACK * torch_error, (kernel_error, torch_error)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [2, 4, 8])
@pytest.mark.parametrize("rows", [2, 16, 64])
@pytest.mark.parametrize("d, ff", CODEC_SHAPES)
def test_gpu_split_k_residual_is_deterministic_and_matches_addmm(d, ff, rows, split_k):
    """ffn[2] + residual with its K shared by split_k programs: the last share sums the partials in
    a fixed order, so 20 calls give one result bit for bit, within bf16 rounding of cuBLAS's."""
    x, weight, _, _ = codec_case(d, ff, "plain", rows, n_major=False)
    config = GemmConfig(16 if rows <= 16 else 64, 32, 128, 4, 4, split_k=split_k)
    start = make_residual(rows, d, torch.bfloat16).cuda()
    results = [fused_linear(x, weight, config=config, residual=start.clone()) for _ in range(20)]
    assert all(torch.equal(r, results[0]) for r in results[1:])
    assert relative_error(results[0], start.clone().addmm_(x, weight.t())) <= BF16_TOLERANCE


@pytest.mark.gpu
def test_gpu_float32_is_not_tf32():
    x, weight, gamma, beta = make_inputs(300, 256, 384, device="cuda")
    got = fused_linear(x, weight, gamma, beta, 1e-5, True, GemmConfig(64, 64, 32, 4, 2))
    assert relative_error(got, reference_fused_linear(x, weight, gamma, beta, 1e-5, True)) <= 1e-5


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_follows_new_inputs():
    x, weight, norm, gelu = codec_case(768, 3072, "norm_gelu", 640)
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fused_linear(static_x, weight, *norm, 1e-5, gelu)  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_linear(static_x, weight, *norm, 1e-5, gelu)
    static_x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, fused_linear(static_x, weight, *norm, 1e-5, gelu))
