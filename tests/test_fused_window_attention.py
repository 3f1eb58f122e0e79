"""The fused streaming kernel (fused_window_attention: RoPE, attention and ring write in one launch)
against the split kernels bit for bit, and against the torch reference.

On CPU through Triton's interpreter (one subprocess, test_window_attention's cases and helpers):
outputs of the real tokens, the rotated qkv and the rings after the step must equal the split
path's exactly (both run window_attention's _query_block at the same tiles), padding tokens of
NaN must stay unread and unwritten. On a GPU the same at the real codec's stage shapes in bf16.
The interpreter runs a program's threads as one, so a missing barrier cannot fail here; writing
the ring before the attention (the order the barriers keep) does.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from moss_tts.codec import load_codec, tiny_codec_config_dict, write_codec_checkpoint
from moss_tts.kernels import fused_window_attention as fwa
from moss_tts.kernels.fused_window_attention import MAX_FUSED_QUERY_BLOCKS, RING_KERNELS, runs_fused
from moss_tts.kernels.window_attention import AttentionConfig, Ring, rope_table, window_attention
from test_window_attention import (BF16_TOLERANCE, GARBAGE, GPU_CASES, GPU_PACKED_CASES, INTERPRETER_CASES,
                                   OTHER_CONFIGS, PACKED_CASES, TOLERANCE, attend, case_errors, make_case,
                                   make_packed_case, packed_case_errors, repeated_row_errors)
from test_codec import SPF, ring_kernel_audio
from triton_interpreter import interpreter_json

INTERPRETER_TIMEOUT_S = 300

RING_CASES = {name: case for name, case in INTERPRETER_CASES.items() if case[4] is not None}
# More packed steps: (heads, head_dim, window, tokens per row, offsets, slots, rows, padding tokens,
# max_len). Slots no row of length > 0 names (here 2 and 4) must keep their GARBAGE.
FUSED_PACKED_CASES = {
    **PACKED_CASES,
    # stream starts (offsets 0 and 1: history shorter than the window), a 1-token row, an empty
    # row on its own slot, 3 heads
    "packed_near_stream_start": (3, 16, 24, [5, 1, 17, 0], [0, 1, 3, 0], 5, [1, 0, 3, 4], 4, 20),
    # every row longer than one 16-query block at m16 configs, one past the window
    "packed_several_blocks": (2, 16, 24, [40, 33, 8], [30, 2, 1000], 5, [0, 1, 3], 2, 40),
}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN included)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def real_tokens(ring: Ring) -> torch.Tensor:
    """Indices (into dim 1 of qkv [1, N, ...]) of the tokens some packed row owns."""
    return torch.cat([torch.arange(s, s + n) for s, n in zip(ring.starts.tolist(), ring.lengths.tolist())]
                     + [torch.zeros(0, dtype=torch.long)]).to(ring.starts.device)


def fused_vs_split(qkv, rope, heads, window, ring, config: AttentionConfig | None = None) -> dict[str, bool]:
    """Both ring kernels on copies of one step: do outputs and rotated qkv (of the real tokens),
    and the rings after it, equal bit for bit? Packed: also whether the fused kernel left the
    padding tokens' qkv as it was, gave the same real outputs whatever the padding held, and
    left the slots of no real row with their GARBAGE."""
    runs = {}
    for kernel in RING_KERNELS:
        x, r = qkv.clone(), replace(ring, keys=ring.keys.clone(), values=ring.values.clone())
        runs[kernel] = (x, attend(x, rope, heads, window, r, config, kernel), r)
    (qkv_s, out_s, ring_s), (qkv_f, out_f, ring_f) = runs["split"], runs["fused"]
    index = real_tokens(ring) if ring.is_packed else slice(None)
    result = {"out": same_bits(out_s[:, index], out_f[:, index]), "qkv": same_bits(qkv_s[:, index], qkv_f[:, index]),
              "keys": same_bits(ring_s.keys, ring_f.keys), "values": same_bits(ring_s.values, ring_f.values),
              "finite": bool(torch.isfinite(out_f[:, index]).all()),
              "ran_fused": runs_fused(ring.max_len if ring.is_packed else qkv.shape[1], config)}
    if ring.is_packed:
        padding = torch.ones(qkv.shape[1], dtype=torch.bool, device=qkv.device)
        padding[index] = False
        # Once more with finite padding (a rotated NaN stays NaN, so the NaN run alone cannot
        # show a rotation of the padding): real outputs unchanged, padding not written.
        finite = qkv.clone()
        finite[:, padding] = GARBAGE
        out = attend(finite, rope, heads, window, replace(ring, keys=ring.keys.clone(), values=ring.values.clone()),
                     config, "fused")
        result["padding_untouched"] = (same_bits(qkv_f[:, padding], qkv[:, padding])
                                       and bool((finite[:, padding] == GARBAGE).all()))
        result["padding_unread"] = same_bits(out[:, index], out_f[:, index])
        written = {row for row, n in zip(ring.rows.tolist(), ring.lengths.tolist()) if n}
        others = [s for s in range(ring.keys.shape[0]) if s not in written]
        result["other_slots_untouched"] = bool((ring_f.keys[others] == GARBAGE).all()
                                               and (ring_f.values[others] == GARBAGE).all())
    return result


def interpreter_main() -> None:
    results = {}
    for label, config in [("default", None), *OTHER_CONFIGS.items()]:
        for name, case in RING_CASES.items():
            qkv, rope, ring = make_case(*case)
            results[f"{name}/{label}"] = {**fused_vs_split(qkv, rope, case[0], case[2], ring, config),
                                          "reference": case_errors(case, config=config, ring_kernel="fused")}
        for name, case in FUSED_PACKED_CASES.items():
            qkv, rope, ring = make_packed_case(case)
            results[f"{name}/{label}"] = {**fused_vs_split(qkv, rope, case[0], case[2], ring, config),
                                          "reference": packed_case_errors(case, config=config, ring_kernel="fused")}
    results["repeated_rows"] = repeated_row_errors(ring_kernel="fused")
    qkv, rope, _ = make_case(*INTERPRETER_CASES["offline_t_above_window"])
    results["offline"] = same_bits(fwa.fused_window_attention(qkv.clone(), rope, 2, 8),
                                   window_attention(qkv.clone(), rope, 2, 8))
    results["codec"] = codec_audio_equal()
    print(json.dumps(results))


def codec_audio_equal() -> bool:
    """The tiny codec (six stages, windows 4..64, head_dim 16) served with each ring kernel:
    batched and packed streaming steps give the same audio bit for bit."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_codec_checkpoint(Path(tmp), tiny_codec_config_dict(), seed=0)
        split, fused = (load_codec(ckpt).serving_form_(ring_kernel=kernel) for kernel in RING_KERNELS)
    assert {m.ring_kernel for m in fused.modules() if hasattr(m, "ring_kernel")} == {"fused"}  # the interpreter runs it
    torch.manual_seed(1)
    codes = split.encode(0.3 * torch.randn(2, 2, 50 * SPF), n_quantizers=12)[0]
    audio = [ring_kernel_audio(codec, codes) for codec in (split, fused)]
    return same_bits(*audio) and bool(torch.isfinite(audio[0]).all())


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    return interpreter_json("test_fused_window_attention", INTERPRETER_TIMEOUT_S)


CONFIGS = ["default", *OTHER_CONFIGS]
BIT_KEYS = ("out", "qkv", "keys", "values", "finite")


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", list(RING_CASES))
def test_interpreter_fused_equals_split_batched(interpreter_results, name, config):
    result = interpreter_results[f"{name}/{config}"]
    assert all(result[key] for key in BIT_KEYS), result
    assert all(e <= TOLERANCE for e in result["reference"].values()), result["reference"]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", list(FUSED_PACKED_CASES))
def test_interpreter_fused_equals_split_packed(interpreter_results, name, config):
    result = interpreter_results[f"{name}/{config}"]
    assert all(result[key] for key in (*BIT_KEYS, "other_slots_untouched")), result
    errors = result["reference"]
    assert all(errors[key] <= TOLERANCE for key in ("out", "keys", "values")), errors


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", list(FUSED_PACKED_CASES))
def test_interpreter_fused_never_touches_padding_tokens(interpreter_results, name, config):
    """Padding tokens are unread (NaN there leaves the real outputs finite, checked above, and as
    they are with finite padding) and unwritten, not even rotated, when the fused kernel ran (the
    split fallback rotates them)."""
    result = interpreter_results[f"{name}/{config}"]
    assert result["padding_unread"] and (result["padding_untouched"] or not result["ran_fused"]), result


def test_interpreter_cases_reach_the_fused_kernel_and_its_fallback(interpreter_results):
    """Most cases run the one kernel; the m16 configs of the longest rows (> 8 blocks) fall back."""
    ran = {name: result["ran_fused"] for name, result in interpreter_results.items() if isinstance(result, dict)
           and "ran_fused" in result}
    assert sum(ran.values()) > 0.8 * len(ran)
    assert not ran["packed_unmasked_tiles/m16_n64"] and ran["packed_unmasked_tiles/default"]


def test_interpreter_fused_repeated_rows_touch_only_their_ring_row(interpreter_results):
    errors = interpreter_results["repeated_rows"]
    assert errors["others"] == 0.0, errors
    assert all(errors[key] <= TOLERANCE for key in ("out", "keys", "values")), errors


def test_interpreter_offline_runs_window_attention(interpreter_results):
    assert interpreter_results["offline"]


def test_interpreter_codec_streams_alike_with_either_ring_kernel(interpreter_results):
    assert interpreter_results["codec"]


def test_runs_fused_up_to_max_query_blocks():
    assert runs_fused(MAX_FUSED_QUERY_BLOCKS * 64) and not runs_fused(MAX_FUSED_QUERY_BLOCKS * 64 + 1)
    assert runs_fused(320)  # the codec's longest chunk: 10 frames x 32 tokens at stage 5
    m16 = AttentionConfig(16, 64, 2, 2)
    assert runs_fused(MAX_FUSED_QUERY_BLOCKS * 16, m16) and not runs_fused(MAX_FUSED_QUERY_BLOCKS * 16 + 1, m16)


def test_cpu_falls_back_to_the_reference():
    case = INTERPRETER_CASES["ring_wrapped"]
    qkv, rope, ring = make_case(*case)
    ref_ring = replace(ring, keys=ring.keys.clone(), values=ring.values.clone())
    expected = window_attention(qkv.clone(), rope, 2, 24, ref_ring)
    assert torch.equal(fwa.fused_window_attention(qkv, rope, 2, 24, ring), expected)
    assert torch.equal(ring.keys, ref_ring.keys) and torch.equal(ring.values, ref_ring.values)


# ------------------------------------------------------------------ GPU, the codec's stages, bf16
# (heads, window, tokens per frame) of the real decoder's six stages (head_dim 64)
GPU_STAGES = ((20, 125, 1), (12, 250, 2), (12, 400, 4), (12, 400, 8), (12, 400, 16), (12, 400, 32))
GPU_FRAMES = (2, 10)  # a row's chunk: 2 .. 320 tokens


def gpu_batched_case(heads: int, window: int, t: int):
    """(heads, 64, window, T, offsets, slots, rows) for make_case: a fresh stream, history shorter
    than the window, the window's edges, a wrapped ring and a position past int32."""
    offsets = [0, 1, window - 1, window, 10 * window + 3, 2**31 + 5]
    return heads, 64, window, t, offsets, 8, [7, 0, 3, 5, 1, 2]


def gpu_packed_step(heads: int, window: int, scale: int, num_rows: int = 256, seed: int = 0):
    """A vocoder round as the graphs run it at one stage: num_rows rows of 1..10 frames (scale
    tokens each) at random positions (some fresh), 16 padding rows of 0 frames on the scratch
    slot and 3 padding frames of NaN at the end; qkv, Rope and a packed Ring of random bf16."""
    gen = torch.Generator().manual_seed(seed)
    frames = torch.randint(1, 11, (num_rows,), generator=gen)
    positions = torch.randint(0, 10 * window // scale, (num_rows,), generator=gen)
    positions[::7] = 0  # fresh streams
    lengths = torch.cat([frames, torch.zeros(16, dtype=torch.long)]) * scale
    offsets = torch.cat([positions, torch.zeros(16, dtype=torch.long)]) * scale
    rows = torch.cat([torch.randperm(num_rows, generator=gen), torch.full((16,), num_rows)])
    starts = torch.cumsum(lengths, 0) - lengths
    total, pad = int(lengths.sum()), 3 * scale
    qkv = torch.randn(1, total + pad, 3 * heads * 64, generator=gen)
    qkv[:, total:] = float("nan")
    token_positions = torch.cat([torch.arange(o, o + n) for o, n in zip(offsets.tolist(), lengths.tolist())]
                                + [torch.arange(1, pad + 1)])  # not 0: a rotated padding token shows
    rope = rope_table(token_positions[None].cuda(), 64, 10000.0)
    keys, values = (torch.randn(num_rows + 1, heads, window, 64, generator=gen) for _ in range(2))
    ring = Ring(keys.cuda().bfloat16(), values.cuda().bfloat16(), rows.cuda(), offsets.cuda(), starts.cuda(),
                lengths.cuda(), 10 * scale)
    return qkv.cuda().bfloat16(), rope, ring


def gpu_batched_ids():
    return [(heads, window, frames * scale) for heads, window, scale in GPU_STAGES for frames in GPU_FRAMES]


@pytest.mark.gpu
@pytest.mark.parametrize("heads, window, t", gpu_batched_ids())
def test_gpu_fused_equals_split_batched_bf16(heads, window, t):
    case = gpu_batched_case(heads, window, t)
    qkv, rope, ring = make_case(*case, dtype=torch.bfloat16, device="cuda")
    result = fused_vs_split(qkv, rope, heads, window, ring)
    assert result["ran_fused"] and all(result[key] for key in BIT_KEYS), result


@pytest.mark.gpu
@pytest.mark.parametrize("heads, window, scale", GPU_STAGES)
def test_gpu_fused_equals_split_packed_256_rows_bf16(heads, window, scale):
    qkv, rope, ring = gpu_packed_step(heads, window, scale)
    result = fused_vs_split(qkv, rope, heads, window, ring)
    # other_slots_untouched does not apply: these rings are random, not GARBAGE
    assert result["ran_fused"], result
    assert all(result[key] for key in (*BIT_KEYS, "padding_untouched", "padding_unread")), result


@pytest.mark.gpu
@pytest.mark.parametrize("name", [name for name, case in GPU_CASES.items() if case[4] is not None])
def test_gpu_fused_matches_reference_bf16(name):
    errors = case_errors(GPU_CASES[name], device="cuda", dtype=torch.bfloat16, ring_kernel="fused")
    assert all(e <= BF16_TOLERANCE for e in errors.values()), errors


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_PACKED_CASES))
def test_gpu_fused_packed_matches_each_row_alone_bf16(name):
    errors = packed_case_errors(GPU_PACKED_CASES[name], device="cuda", dtype=torch.bfloat16, ring_kernel="fused")
    assert all(errors[key] <= BF16_TOLERANCE for key in ("out", "keys", "values")), errors
