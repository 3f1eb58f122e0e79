"""The SiLU kernels of a decode step (kernels/gated_silu.py) against torch: on CPU through Triton's
interpreter (one subprocess, since TRITON_INTERPRET must be set before triton is imported), the
CPU fallback, the served fused-function set, and on a GPU at the model's sizes."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from moss_tts.kernels import fused, gated_silu
from triton_interpreter import interpreter_json, relative_error

TOLERANCE = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}
# name -> (leading shape, width of the result, dtype); widths below, at and past one block
CASES = {
    "f32_rows3_w40": ((3,), 40, "float32"),
    "f32_b2_t1_w1024": ((2, 1), 1024, "float32"),
    "f32_rows2_w1500": ((2,), 1500, "float32"),
    "f16_rows4_w300": ((4,), 300, "float16"),
    "f32_prefill_n2_t3_w300": ((2, 3), 300, "float32"),  # a batched prefill's [N, T, 2I]
}


def errors(lead, width, dtype, device="cpu", seed=0) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(*lead, 2 * width, generator=gen) * 3).to(device=device, dtype=getattr(torch, dtype))
    gate, up = gate_up.float().chunk(2, dim=-1)
    got_gated, got = gated_silu.silu_mul_merged(gate_up), gated_silu.silu(gate_up)
    assert got_gated.shape == (*lead, width) and got.shape == gate_up.shape
    assert got_gated.dtype == got.dtype == gate_up.dtype
    return {"gated": relative_error(got_gated, F.silu(gate) * up), "silu": relative_error(got, F.silu(gate_up.float()))}


def interpreter_main() -> None:
    print(json.dumps({name: errors(*case) for name, case in CASES.items()}))


@pytest.fixture(scope="module")
def interpreter_errors():
    return interpreter_json("test_gated_silu", 300)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_kernels_match_torch(interpreter_errors, name):
    assert all(e <= TOLERANCE[CASES[name][-1]] for e in interpreter_errors[name].values()), interpreter_errors[name]


def test_cpu_takes_the_torch_functions_exactly():
    x = torch.randn(3, 2, 64)
    assert torch.equal(gated_silu.silu_mul_merged(x), fused.silu_mul_merged(x))
    assert torch.equal(gated_silu.silu(x), F.silu(x))


def test_the_compiled_set_serves_the_kernels():
    compiled = fused.Fusions.compiled()
    assert compiled.silu_mul_merged is gated_silu.silu_mul_merged and compiled.silu is gated_silu.silu


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 256])
def test_gpu_kernels_match_torch_at_model_sizes(rows):
    """The backbone's merged gate/up (2 x 9728) and the local fc_in output (9728), bf16."""
    e = errors((rows, 1), 9728, "bfloat16", "cuda")
    assert all(v <= TOLERANCE["bfloat16"] for v in e.values()), e
