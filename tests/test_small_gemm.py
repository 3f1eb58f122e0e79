"""The codec's small-GEMM path (codec.transformer, TransformerLayer.small_gemm_): steps of at most
`small_gemm_rows` tokens at a stage run each layer's four GEMMs as kernels/fused_linear.py's, with
the LayerNorms, the GELU and the residual adds inside.

Under Triton's interpreter (one subprocess: TRITON_INTERPRET must be set before triton is
imported) the tiny codec, fp32, decodes the same audio with the path on as off, up to fp32
summation order, in batched and packed streaming steps and offline, and the path runs exactly
where the shapes say. On the CPU without the interpreter nothing changes and bad settings are
refused; on a GPU, bf16 audio stays within the codec's bf16 tolerance of the served form.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

from moss_tts.codec import load_codec, tiny_codec_config_dict, write_codec_checkpoint
from moss_tts.codec.transformer import DEFAULT_FUSION, SMALL_GEMM_MAX_ROWS, TransformerLayer
from moss_tts.kernels import fused_linear
from moss_tts.kernels.window_attention import rope_table
from moss_tts.vocoder.config import VocoderPlacement, codec_small_gemm_rows
from test_codec import SPF, assert_close_to_peak, ring_kernel_audio
from triton_interpreter import interpreter_json

INTERPRETER_TIMEOUT_S = 600
FP32_REL = 1e-4  # of the audio's peak: fp32 on both sides, only the order of sums differs
BF16_REL = 0.03  # the codec's other bf16 GPU checks (test_codec.py)


def tiny_codecs(small_gemm_rows: int, device: str = "cpu", dtype=torch.float32, fusion: str = "none"):
    """The tiny codec (six one-layer stages, d 32) served without and with the small-GEMM path."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_codec_checkpoint(Path(tmp), tiny_codec_config_dict(), seed=0)
        return tuple(load_codec(ckpt, device, dtype).serving_form_(fusion, small_gemm_rows=rows)
                     for rows in (0, small_gemm_rows))


def counted_calls(codec, run) -> tuple[torch.Tensor, int]:
    """run(codec)'s result and how many fused_linear calls it made. Patches the module attribute:
    only for the interpreter's single-threaded subprocess."""
    calls, original = [], fused_linear.fused_linear

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    fused_linear.fused_linear = counting
    try:
        return run(codec), len(calls)
    finally:
        fused_linear.fused_linear = original


def step_calls(codec, frames: int) -> int:
    """fused_linear calls of one 1-row streaming step of `frames` frames."""
    codes = torch.zeros(1, frames, 12, dtype=torch.long)
    return counted_calls(codec, lambda c: c.decode_step(codes, c.new_decode_state(1)))[1]


def interpreter_main() -> None:
    torch.manual_seed(1)
    results = {}
    for rows in (8, 64):
        off, on = tiny_codecs(rows)
        codes = off.encode(0.3 * torch.randn(2, 2, 50 * SPF), n_quantizers=12)[0]
        streamed_off, streamed_on = ring_kernel_audio(off, codes), ring_kernel_audio(on, codes)
        offline_off, (offline_on, offline_calls) = off.decode(codes), counted_calls(on, lambda c: c.decode(codes))
        results[str(rows)] = {
            "layers_on": sorted({m.small_gemm_rows for m in on.modules() if isinstance(m, TransformerLayer)}),
            "streamed_err": (streamed_on - streamed_off).abs().max().item() / streamed_off.abs().max().item(),
            "offline_err": (offline_on - offline_off).abs().max().item() / offline_off.abs().max().item(),
            "finite": bool(torch.isfinite(streamed_on).all() and torch.isfinite(offline_on).all()),
            # A 1x2 step has 2, 4, 8, 16, 32, 64 tokens at the six stages; 50 frames offline at
            # least 50 at each: the path runs at the stages whose tokens fit `rows`, nowhere else.
            "calls_1x2": step_calls(on, 2), "calls_1x2_off": step_calls(off, 2), "calls_offline": offline_calls}
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    return interpreter_json("test_small_gemm", INTERPRETER_TIMEOUT_S)


@pytest.mark.parametrize("rows, small_stages", [(8, 3), (64, 6)])
def test_interpreter_runs_the_path_where_the_tokens_fit(interpreter_results, rows, small_stages):
    result = interpreter_results[str(rows)]
    assert result["layers_on"] == [rows]
    assert result["calls_1x2"] == 4 * small_stages and result["calls_1x2_off"] == 0
    assert result["calls_offline"] == 0  # 50 frames: more tokens than `rows` at every stage


@pytest.mark.parametrize("rows", [8, 64])
def test_interpreter_audio_is_the_same_with_the_path(interpreter_results, rows):
    result = interpreter_results[str(rows)]
    assert result["finite"]
    assert result["streamed_err"] <= FP32_REL and result["offline_err"] <= FP32_REL, result


# ------------------------------------------------------------------ CPU contract
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter runs the path on the CPU")
def test_on_the_cpu_nothing_changes():
    off, on = tiny_codecs(64)
    assert {m.small_gemm_rows for m in on.modules() if isinstance(m, TransformerLayer)} == {0}
    codes = torch.randint(0, 1024, (1, 6, 12))
    assert torch.equal(off.decode_step(codes, off.new_decode_state(1)), on.decode_step(codes, on.new_decode_state(1)))


@pytest.mark.parametrize("rows", [-1, SMALL_GEMM_MAX_ROWS + 1])
def test_bad_settings_are_refused_naming_the_parameter(rows):
    with pytest.raises(ValueError, match=r"small_gemm_rows must lie in \[0, 64\]"):
        tiny_codecs(rows)
    with pytest.raises(ValueError, match=r"parameter vocoder_small_gemm_rows must lie in \[0, 64\]"):
        VocoderPlacement(vocoder_small_gemm_rows=rows)
    with pytest.raises(ValueError, match=r"vocoder parameter small_gemm_rows must lie in \[0, 64\]"):
        codec_small_gemm_rows({"small_gemm_rows": str(rows)})
    with pytest.raises(ValueError, match="small_gemm_rows='many' is not a valid int"):
        codec_small_gemm_rows({"small_gemm_rows": "many"})


@pytest.mark.parametrize("fusion, approximate", [("none", "none"), ("ln", "none"), ("lt_gelu", "tanh"),
                                                  ("ln_lt_gelu", "tanh"), ("norm_gelu", "none")])
def test_the_path_computes_the_layers_own_gelu(monkeypatch, fusion, approximate):
    """The cuBLASLt fusions compute the tanh GELU on larger steps, so the path does too on small
    ones: a stream's audio must not depend on the size of the step it shared. (fused_linear's
    torch reference stands in for the kernel here; the interpreter tests run the kernel.)"""
    calls = []

    def recording(*args, **kwargs):
        calls.append(kwargs.get("approximate", "none") if kwargs.get("gelu") else None)
        return fused_linear.reference_fused_linear(*args, **kwargs)

    layer = TransformerLayer(tiny_codec_config(0))
    layer.fold_layer_scale_()
    layer.fusion = fusion  # as fuse_ leaves it on a GPU
    monkeypatch.setattr(fused_linear, "fused_linear", recording)
    x = torch.randn(1, 2, layer.norm1.normalized_shape[0])
    stage = tiny_codec_config(0)
    rope = rope_table(torch.arange(2)[None], stage.head_dim, stage.max_period)
    layer._small_gemm_forward(x, rope, None)
    assert calls == [None, None, approximate, None]


def tiny_codec_config(index: int):
    """The tiny codec's decoder stage `index` (a TransformerStage)."""
    from moss_tts.codec.config import CodecConfig, TransformerStage
    config = CodecConfig.from_dict(tiny_codec_config_dict(), "tiny")
    return [s for s in config.decoder if isinstance(s, TransformerStage)][index]


def test_the_parameters_parse_and_default_to_off():
    assert codec_small_gemm_rows({}) == 0 and codec_small_gemm_rows({"small_gemm_rows": ""}) == 0
    assert codec_small_gemm_rows({"small_gemm_rows": " 64 "}) == 64
    assert VocoderPlacement().vocoder_small_gemm_rows == 0
    assert VocoderPlacement.from_parameters({"vocoder_small_gemm_rows": "64"}).vocoder_small_gemm_rows == 64


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_audio_stays_within_the_served_forms_tolerance(dtype):
    """The served fusion (tanh GELU in cuBLASLt's epilogue) against the same with every 1x2-step
    stage on the small-GEMM path (the same tanh GELU there): streamed and packed audio agree within
    rounding (fp32) and the codec's bf16 tolerance."""
    off, on = tiny_codecs(64, "cuda", dtype, DEFAULT_FUSION)
    assert {m.small_gemm_rows for m in on.modules() if isinstance(m, TransformerLayer)} == {64}
    torch.manual_seed(1)
    codes = off.encode(0.3 * torch.randn(2, 2, 50 * SPF, device="cuda", dtype=dtype), n_quantizers=12)[0]
    expected = ring_kernel_audio(off, codes, "cuda").float()
    assert_close_to_peak(ring_kernel_audio(on, codes, "cuda").float(), expected,
                         rel=1e-4 if dtype == torch.float32 else BF16_REL)
