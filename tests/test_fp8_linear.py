"""fp8 GEMMs of the backbone (kernels/fp8_linear.py, EngineConfig.fp8_weights): the quantizing
kernel against its torch reference (in Triton's interpreter on CPU, at the model's sizes on a
GPU), the quantization's error bounds, and an fp8 engine equal to the reference loop run on the
same quantized model. The GPU engine test builds its own model: fp8 rewrites the model it runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from moss_tts.engine import Engine, EngineConfig, EngineRequest
from moss_tts.engine.backbone import merge_projections
from moss_tts.kernels import fp8_linear, gated_silu
from moss_tts.model.generation import generate
from triton_interpreter import interpreter_json

from engine_events import Collector, TIMEOUT_S, assert_matches_reference

# name -> (rows, width, dtype, gated); widths below, at and past the kernel's 1,024-column tile
CASES = {
    "f32_rows3_w40": (3, 40, "float32", False),
    "bf16_rows5_w2600": (5, 2600, "bfloat16", False),
    "f16_rows2_w3000": (2, 3000, "float16", False),
    "bf16_rows4_w1500_gated": (4, 1500, "bfloat16", True),
    "f32_rows3_w1024_gated": (3, 1024, "float32", True),
}


def sample(rows: int, width: int, dtype: str, gated: bool, device="cpu", seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2 * width if gated else width, generator=gen) * 3
    x[0, :7] = torch.tensor([0.0, 1e-9, -1e-6, 3e-4, 448.0, -1000.0, 7.5])  # tiny, subnormal-range, large
    return x.to(device=device, dtype=getattr(torch, dtype))


def codes_match(x: torch.Tensor, gated: bool) -> dict:
    """The kernel's codes and scales against the reference's; gated rows against the reference
    quantizing the served SiLU kernel's output (same formula and rounding, both run here)."""
    codes, scale = fp8_linear.quantize_rows(x, gated)
    values = gated_silu.silu_mul_merged(x) if gated else x
    ref_codes, ref_scale = fp8_linear.reference_quantize_rows(values)
    return {"bytes_equal": torch.equal(codes.view(torch.uint8), ref_codes.view(torch.uint8)),
            "codes_equal": torch.equal(codes.float(), ref_codes.float()),  # -0 == +0
            "scale_equal": torch.equal(scale, ref_scale),
            "shape": list(codes.shape), "dtype": str(codes.dtype)}


def interpreter_main() -> None:
    out = {name: codes_match(sample(*case), case[-1]) for name, case in CASES.items()}
    out["zero_row"] = codes_match(torch.zeros(2, 64), False)
    print(json.dumps(out))


@pytest.fixture(scope="module")
def interpreter_results():
    return interpreter_json("test_fp8_linear", 300)


@pytest.mark.parametrize("name", [*CASES, "zero_row"])
def test_interpreter_kernel_writes_the_reference_codes(interpreter_results, name):
    # Values, not bytes: the interpreter's own fp8 cast writes -0 as +0 (a GPU keeps the sign;
    # the GPU test below compares bytes). The kernel rounds before that cast (_e4m3_grid).
    r = interpreter_results[name]
    assert r["codes_equal"] and r["scale_equal"] and r["dtype"] == "torch.float8_e4m3fn", r


def test_reference_quantization_is_within_half_a_step():
    x = sample(8, 512, "float32", False)
    codes, scale = fp8_linear.reference_quantize_rows(x)
    back = codes.float() * scale
    # e4m3: 3 mantissa bits, so a normal value is off by at most 2^-4 of itself; below 2^-6 of
    # the row's scale (the subnormal range) by at most half of 2^-9 x scale.
    bound = torch.maximum(x.abs() * 2 ** -4, scale * 2 ** -10)
    assert bool(((back - x).abs() <= bound * (1 + 1e-6)).all())
    assert torch.equal(codes.float().abs().amax(dim=1), torch.full((8,), 448.0))  # each row's max is 448


def test_weight_rows_are_views_with_their_own_scales():
    w = torch.randn(48, 64) * torch.linspace(0.1, 10, 48)[:, None]
    q = fp8_linear.quantize_weight(w)
    assert q.data.dtype == fp8_linear.FP8 and q.scale.shape == (1, 48)
    assert torch.allclose(q.scale[0], w.abs().amax(dim=1) / 448)
    part = q.rows(16, 32)
    assert part.data.data_ptr() == q.data[16].data_ptr() and part.out_features == 16
    assert torch.equal(part.scale, q.scale[:, 16:32])


@pytest.mark.parametrize("gated", [False, True])
def test_linear_is_the_float_product_within_fp8_error(gated):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 2 * 256 if gated else 256, generator=gen)
    w = torch.randn(96, 256, generator=gen)
    got = fp8_linear.linear(x, fp8_linear.quantize_weight(w), gated)
    want = (F.silu(x[:, :256]) * x[:, 256:] if gated else x) @ w.t()
    rel = ((got - want).norm() / want.norm()).item()
    assert got.shape == (6, 96) and 1e-4 < rel < 0.05, rel  # really rounded, and only as much as fp8 rounds


def test_fp8_engine_equals_the_reference_loop_on_the_quantized_model(tiny_dir, prompts_for_fp8):
    """CPU: merged fp8 GEMMs and the fused SwiGLU quantization compute what the model's own fp8
    modules compute (generate() runs them), frame for frame."""
    from moss_tts.contract.sampling_params import SamplingParams
    from moss_tts.model.loading import load_model

    model = load_model(tiny_dir / "model")  # its own: fp8 rewrites the model it runs
    params = [SamplingParams(seed=200 + i, max_frames=10 + i, ignore_stop=True) for i in range(len(prompts_for_fp8))]
    sink = Collector()
    engine = Engine(model, EngineConfig(max_running_requests=3, fp8_weights=True), sink)
    ids = [f"f{i}" for i in range(len(prompts_for_fp8))]
    engine.start()
    try:
        for rid, prompt, p in zip(ids, prompts_for_fp8, params):
            engine.submit(EngineRequest(rid, prompt, p))
        sink.wait_finished(ids)
    finally:
        engine.shutdown(TIMEOUT_S)
    layer = model.transformer.layers[0]
    assert isinstance(layer.self_attn.q_proj, fp8_linear.Fp8Linear)
    assert isinstance(layer.mlp.down_proj, fp8_linear.Fp8Linear)
    merged = merge_projections(model.transformer)
    assert merged[0].is_fp8 and merged[0].qkv is None and merged[0].gate_up is None  # bf16 freed
    reference = generate(model, prompts_for_fp8, params)
    for rid, ref in zip(ids, reference):
        assert_matches_reference(sink, rid, ref)


@pytest.fixture(scope="module")
def prompts_for_fp8(builder):
    from moss_tts.model.processor import PromptSpec

    return [builder.build(PromptSpec(text)) for text in ("Hello there.", "A longer sentence, to speak.", "Bye.",
                                                         "Good morning, everyone.")]


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 256])
@pytest.mark.parametrize("width,gated", [(2560, False), (4096, False), (9728, True)])
def test_gpu_kernel_writes_the_reference_codes_at_model_sizes(rows, width, gated):
    """The inputs of qkv / gate_up (2,560), o_proj (4,096) and down_proj (9,728, gated) in bf16."""
    r = codes_match(sample(rows, width, "bfloat16", gated, "cuda"), gated)
    assert r["bytes_equal"] and r["scale_equal"], r


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 256])
def test_gpu_scaled_mm_matches_the_dequantized_product(rows):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(rows, 2560, generator=gen)).to("cuda", torch.bfloat16)
    w = fp8_linear.quantize_weight((torch.randn(6144, 2560, generator=gen) * 0.02).to("cuda", torch.bfloat16))
    got = fp8_linear.linear(x, w)
    codes, scale = fp8_linear.quantize_rows(x)
    want = fp8_linear.reference_mm(codes, scale, w, torch.float32)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want).abs().max() / want.abs().max()).item() < 1e-2  # bf16 output rounding


@pytest.mark.gpu
def test_gpu_fp8_engine_graphed_equals_eager():
    """Its own real-size model (fp8 replaces the projections of the model it runs)."""
    from moss_tts.model.config import MossTTSConfig, real_model_config_dict
    from moss_tts.model.loading import build_random_model
    from test_gpu_engine import _requests, _run

    model = build_random_model(MossTTSConfig.from_dict(real_model_config_dict(), "real"), "cuda", torch.bfloat16,
                               seed=0)
    config = EngineConfig(max_running_requests=8, max_seq_len=256, cuda_graph_prefill_tokens=256, fp8_weights=True)
    prompts, params = _requests()
    graphed, stats = _run(model, config, prompts, params)
    eager, _ = _run(model, replace(config, enforce_eager=True), prompts, params)
    for rid in graphed:
        assert torch.equal(graphed[rid], eager[rid]), f"{rid}: graphed fp8 codes differ from eager"
    assert stats.decode_graph_hits > 0 and stats.decode_graph_fallbacks == 0, stats
    assert isinstance(model.transformer.layers[0].mlp.down_proj, fp8_linear.Fp8Linear)
    del model
    torch.cuda.empty_cache()
