"""kernels/layer_norm.py against F.layer_norm.

On CPU through Triton's interpreter (fp32, ragged rows and widths, one subprocess, since
TRITON_INTERPRET must be set before triton is imported), and on a GPU in bf16 at the codec's
widths, where it must be as accurate as torch's own kernel and replay under a CUDA graph.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from moss_tts.kernels.layer_norm import is_supported, layer_norm
from triton_interpreter import interpreter_json, relative_error

# name -> (leading shape, width, mean of x, gamma/beta given). Widths below, at and above a
# power of two; row counts not a multiple of the rows a program takes.
CASES = {
    "tiny_codec_width": ((3, 37), 32, 0.0, True),
    "codec_width_768": ((5,), 768, 0.0, True),
    "codec_width_1280": ((1, 3), 1280, 0.0, True),
    "ragged_width": ((9,), 100, 0.0, True),
    "mean_far_from_zero": ((7,), 96, 1000.0, True),  # a one-pass E[x^2] - E[x]^2 would fail here
    "no_affine": ((6,), 64, 0.0, False),
}
FP32_TOLERANCE = 1e-5  # max |diff| / max |reference|: only the order of fp32 sums differs
FAR_MEAN_TOLERANCE = 1e-4  # x ~ 1000 resolves to 6e-5 in fp32: (x - mean) carries that error


def make_inputs(lead, width, mean=0.0, affine=True, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, width, generator=gen) * 2 + mean
    gamma = 1 + 0.2 * torch.randn(width, generator=gen)
    beta = 0.2 * torch.randn(width, generator=gen)
    x, gamma, beta = (t.to(device, dtype) for t in (x, gamma, beta))
    return (x, gamma, beta) if affine else (x, None, None)


def case_error(case) -> float:
    lead, width, mean, affine = case
    x, gamma, beta = make_inputs(lead, width, mean, affine)
    assert is_supported(x, gamma)
    got = layer_norm(x, gamma, beta, 1e-5)
    assert got.shape == x.shape and got.dtype == x.dtype
    return relative_error(got, F.layer_norm(x, (width,), gamma, beta, 1e-5))


def layout_errors() -> dict[str, float]:
    """Inputs the codec does not make but the function takes: one row as a 1-D tensor, rows read
    through a transposed view, beta without gamma, half-precision rows (fp32 math inside)."""
    x, gamma, beta = make_inputs((24,), 40)
    cases = {"one_dim": (x[0], gamma, beta), "transposed": (x.t().contiguous().t(), gamma, beta),
             "bias_only": (x, None, beta), "float16": (x.half(), gamma.half(), beta.half())}
    errors = {}
    for name, (rows, g, b) in cases.items():
        assert is_supported(rows, g, b)
        expected = F.layer_norm(rows.float(), (40,), None if g is None else g.float(), b.float(), 1e-5)
        got = layer_norm(rows, g, b, 1e-5)
        assert got.shape == rows.shape and got.dtype == rows.dtype
        errors[name] = relative_error(got, expected)
    return errors


def interpreter_main() -> None:
    errors = {name: case_error(case) for name, case in CASES.items()}
    errors.update(layout_errors())
    # Rows wider than the kernel takes, or gamma of another width, go to F.layer_norm.
    errors["widest_supported"] = float(is_supported(torch.zeros(1, 8192), None))
    errors["too_wide_supported"] = float(is_supported(torch.zeros(1, 8193), None))
    errors["wrong_bias_supported"] = float(is_supported(torch.zeros(1, 8), None, torch.zeros(9)))
    print(json.dumps(errors))


@pytest.fixture(scope="module")
def interpreter_errors() -> dict[str, float]:
    return interpreter_json("test_layer_norm", 300)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_kernel_matches_torch(interpreter_errors, name):
    tolerance = FAR_MEAN_TOLERANCE if name == "mean_far_from_zero" else FP32_TOLERANCE
    assert interpreter_errors[name] <= tolerance


@pytest.mark.parametrize("name", ["one_dim", "transposed", "bias_only"])
def test_interpreter_other_layouts_match_torch(interpreter_errors, name):
    assert interpreter_errors[name] <= FP32_TOLERANCE


def test_interpreter_half_rows_round_once(interpreter_errors):
    assert interpreter_errors["float16"] <= 2 ** -10  # one fp16 rounding of an fp32 result


def test_rows_too_wide_or_a_mismatched_bias_go_to_torch(interpreter_errors):
    assert interpreter_errors["widest_supported"] == 1.0
    assert interpreter_errors["too_wide_supported"] == 0.0 and interpreter_errors["wrong_bias_supported"] == 0.0


def test_cpu_runs_torch_itself():
    x, gamma, beta = make_inputs((4,), 16)
    assert not is_supported(x, gamma)  # no TRITON_INTERPRET in this process, no GPU
    assert torch.equal(layer_norm(x, gamma, beta, 1e-5), F.layer_norm(x, (16,), gamma, beta, 1e-5))


# ------------------------------------------------------------------ GPU, bf16, the codec's widths
# Rows: one token; a 256-row round's last stage (ragged); and past 2**31 / 768 elements' worth of
# row offsets is left to the int64 cast (not allocated here).
GPU_ROWS = [1, 2, 43_553]
ACCURACY_SLACK = 1.05  # mean error vs the fp32 oracle, kernel over torch's kernel


@pytest.mark.gpu
@pytest.mark.parametrize("rows", GPU_ROWS)
@pytest.mark.parametrize("width", [768, 1280])
def test_gpu_bf16_matches_torch_and_is_as_accurate(width, rows):
    x, gamma, beta = make_inputs((rows,), width, dtype=torch.bfloat16, device="cuda")
    got = layer_norm(x, gamma, beta, 1e-5)
    by_torch = F.layer_norm(x, (width,), gamma, beta, 1e-5)
    # Both round an fp32 value to bf16; the fp32 values differ in their last bits, so a result
    # may land on the neighbouring bf16: one ulp, 2^-8 of it relative at most.
    assert relative_error(got, by_torch) <= 2 ** -7
    exact = F.layer_norm(x.float(), (width,), gamma.float(), beta.float(), 1e-5)
    kernel_error = (got.float() - exact).abs().mean().item()
    torch_error = (by_torch.float() - exact).abs().mean().item()
    assert kernel_error <= ACCURACY_SLACK * torch_error, (kernel_error, torch_error)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_follows_new_inputs():
    x, gamma, beta = make_inputs((640,), 768, dtype=torch.bfloat16, device="cuda")
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer_norm(static_x, gamma, beta)  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer_norm(static_x, gamma, beta)
    static_x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, layer_norm(static_x, gamma, beta))
