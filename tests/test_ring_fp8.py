"""The codec's decode-state rings in fp8 e4m3 (codec.transformer.RING_DTYPES, MossAudioCodec.
serving_form_'s ring_dtype; kernels/kv_format.py's rule): the window-attention kernels (split and
fused) read and write an fp8 ring exactly as the torch reference does, on CPU through Triton's
interpreter (one subprocess) and on a GPU at the real codec's head size; a codec streams on it, a
little off the exact ring and never equal to it; the parameters that choose it are checked."""

from __future__ import annotations

import copy
import types

import pytest
import torch

from moss_tts.codec import load_codec
from moss_tts.codec.checkpoint import write_codec_checkpoint
from moss_tts.codec.config import tiny_codec_config_dict
from moss_tts.kernels import kv_format
from moss_tts.kernels.window_attention import Ring, reference_window_attention
from moss_tts.vocoder.config import VocoderPlacement, codec_ring_dtype
from test_window_attention import (GPU_CASES, GPU_PACKED_CASES, INTERPRETER_CASES, PACKED_CASES, attend, make_case,
                                   make_packed_case)
from triton_interpreter import interpreter_json

FP8 = torch.float8_e4m3fn
INTERPRETER_TIMEOUT_S = 300
RING_CASES = ("ring_partly_filled", "ring_wrapped", "chunk_longer_than_window", "one_query", "unmasked_tiles")
PACKED_RING_CASES = ("packed_mixed_lengths", "packed_unmasked_tiles")


def as_fp8(ring: Ring) -> Ring:
    """The ring's contents stored as an fp8 ring stores them (GARBAGE slots clamp to 448: never read)."""
    return Ring(kv_format.to_cache(ring.keys, FP8), kv_format.to_cache(ring.values, FP8), ring.rows, ring.offsets,
                ring.starts, ring.lengths, ring.max_len)


def fp8_ring_errors(case, packed: bool, ring_kernel: str, device: str = "cpu", dtype=torch.float32) -> dict:
    """One streaming step of the kernels on an fp8 ring against the reference on a copy of it: the
    output's max abs error, and the share of ring values that differ after the writes (by value:
    the interpreter's rounding writes +0 where a cast writes -0)."""
    qkv, rope, ring = (make_packed_case(case, device, dtype) if packed else
                       make_case(*case, dtype=dtype, device=device))
    heads, window = case[0], case[2]
    ring = as_fp8(ring)
    ref = Ring(ring.keys.clone(), ring.values.clone(), ring.rows, ring.offsets, ring.starts, ring.lengths,
               ring.max_len)
    expected = reference_window_attention(qkv.float(), rope, heads, window, ref)
    got = attend(qkv.clone(), rope, heads, window, ring, None, ring_kernel)
    if packed:  # tokens no row owns are never written by the kernels: compare the rows' own
        total = sum(case[3])
        got, expected = got[:, :total], expected[:, :total]
    return {"out": (got.float() - expected).abs().max().item(),
            "keys": (ring.keys.float() != ref.keys.float()).float().mean().item(),
            "values": (ring.values.float() != ref.values.float()).float().mean().item(),
            "dtype": str(ring.keys.dtype)}


def interpreter_main() -> None:
    import json

    errors = {}
    for kernel in ("split", "fused"):
        errors.update({f"{name}/{kernel}": fp8_ring_errors(INTERPRETER_CASES[name], False, kernel)
                       for name in RING_CASES})
        errors.update({f"{name}/{kernel}": fp8_ring_errors(PACKED_CASES[name], True, kernel)
                       for name in PACKED_RING_CASES})
    print(json.dumps(errors))


@pytest.fixture(scope="module")
def interpreter_errors() -> dict:
    return interpreter_json("test_ring_fp8", INTERPRETER_TIMEOUT_S)


@pytest.mark.parametrize("kernel", ["split", "fused"])
@pytest.mark.parametrize("name", RING_CASES + PACKED_RING_CASES)
def test_interpreter_kernels_read_and_write_an_fp8_ring_as_the_reference(interpreter_errors, name, kernel):
    errors = interpreter_errors[f"{name}/{kernel}"]
    # both read the same fp8 values, widened exactly; the new keys are clamped and rounded once each
    assert errors["dtype"] == "torch.float8_e4m3fn" and errors["out"] <= 1e-4, errors
    assert errors["keys"] == 0.0 and errors["values"] == 0.0, errors


def test_reference_writes_clamped_fp8_into_the_ring():
    qkv, rope, ring = make_case(*INTERPRETER_CASES["ring_wrapped"])
    qkv = qkv * 200  # values past e4m3's 448: clamped, not NaN
    ring = as_fp8(ring)
    reference_window_attention(qkv, rope, 2, 24, ring)
    assert not ring.keys.float().isnan().any() and ring.values.float().abs().max() == kv_format.FP8_E4M3_MAX


# ------------------------------------------------------------------ a codec on fp8 rings (CPU, torch)
@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    return load_codec(write_codec_checkpoint(tmp_path_factory.mktemp("codec"), tiny_codec_config_dict(), seed=0))


def _stream(codec, codes, ring_dtype: str) -> tuple[torch.Tensor, list]:
    state = codec.new_decode_state(2, ring_dtype=ring_dtype)
    out, start = [], 0
    for n in (3, 7, 1, 13, 6):
        out.append(codec.decode_step(codes[:, start:start + n], state))
        start += n
    return torch.cat(out, dim=-1), state.caches


def test_a_codec_streams_on_fp8_rings_close_to_the_exact_ones(codec):
    codes = torch.randint(0, codec.codebook_size, (2, 30, 12), generator=torch.Generator().manual_seed(3))
    exact, exact_caches = _stream(codec, codes, "auto")
    fp8, fp8_caches = _stream(codec, codes, "fp8_e4m3")
    assert all(c.dtype == FP8 for c in fp8_caches) and all(c.dtype == torch.float32 for c in exact_caches)
    error = fp8 - exact
    snr = 10 * torch.log10(exact.square().sum() / error.square().sum()).item()
    assert error.abs().max() > 0 and 25.0 < snr, snr  # read (the audio moves), and close


def test_serving_form_sets_the_ring_dtype_of_new_states(codec, monkeypatch):
    codec = copy.deepcopy(codec).serving_form_(ring_dtype="fp8_e4m3")  # the module's codec stays as loaded
    assert codec.new_decode_state(1).caches[0].dtype == FP8
    assert codec.new_decode_state(1, ring_dtype="auto").caches[0].dtype == torch.float32
    with pytest.raises(ValueError, match="ring_dtype"):
        codec.serving_form_(ring_dtype="int8")  # the engine's int8 needs scales: not a ring's
    with pytest.raises(ValueError, match="ring_dtype"):
        codec.new_decode_state(1, ring_dtype="fp8")
    # an fp8 ring on a GPU older than Ada is refused, naming the setting
    monkeypatch.setattr(codec, "_param", lambda stack: types.SimpleNamespace(device=torch.device("cuda", 0)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="ring_dtype='fp8_e4m3' needs a GPU"):
        codec.serving_form_(ring_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match="ring_dtype='fp8_e4m3' needs a GPU"):
        codec.new_decode_state(1, ring_dtype="fp8_e4m3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    codec.serving_form_(ring_dtype="fp8_e4m3")


def test_an_fp8_state_whose_rows_are_not_whole_words_resets():
    from moss_tts.codec.streaming import CodecDecodeState

    state = CodecDecodeState.empty(3, [(1, 3, 2)], torch.device("cpu"), FP8)  # 6-byte rows
    state.caches[0].fill_(1.0)
    state.reset_rows([1])
    assert (state.caches[0][:, 1].float() == 0).all() and (state.caches[0][:, [0, 2]].float() == 1).all()


def test_the_parameters_that_choose_the_ring_dtype():
    assert VocoderPlacement().vocoder_ring_dtype == "auto" and VocoderPlacement().codec_form[3] == "auto"
    assert VocoderPlacement.from_parameters({"vocoder_ring_dtype": "fp8_e4m3"}).codec_form[3] == "fp8_e4m3"
    with pytest.raises(ValueError, match="vocoder_ring_dtype"):
        VocoderPlacement.from_parameters({"vocoder_ring_dtype": "fp8"})
    assert codec_ring_dtype({}) == "auto" and codec_ring_dtype({"ring_dtype": "fp8_e4m3"}) == "fp8_e4m3"
    with pytest.raises(ValueError, match="vocoder parameter ring_dtype"):
        codec_ring_dtype({"ring_dtype": "int8"})


# ------------------------------------------------------------------ GPU, real head size, bf16
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["split", "fused"])
@pytest.mark.parametrize("name", ["stage0_10_frames", "stage5_10_frames", "stage0_packed", "stage5_packed"])
def test_gpu_kernels_read_and_write_an_fp8_ring_as_the_reference(name, kernel):
    packed = name in GPU_PACKED_CASES
    errors = fp8_ring_errors((GPU_PACKED_CASES if packed else GPU_CASES)[name], packed, kernel, "cuda", torch.bfloat16)
    # the reference in fp32 on the same bf16 inputs (test_window_attention's bf16 tolerance); the
    # written keys are bf16 rotations on both sides, which may round to the other fp8 neighbour
    assert errors["out"] <= 3e-2 and errors["keys"] <= 2e-2 and errors["values"] == 0.0, errors
