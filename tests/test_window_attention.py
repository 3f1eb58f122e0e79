"""The codec's window-attention kernels against their torch reference: outputs and ring writes.

On CPU through Triton's interpreter (small shapes, one subprocess, since TRITON_INTERPRET must be
set before triton is imported), the reference's own properties (streaming in chunks == offline,
only the decoded rows' rings change), and on a GPU at the real codec's head size in bf16.
"""

from __future__ import annotations

import json

import pytest
import torch

from moss_tts.kernels import window_attention as wa
from moss_tts.kernels.fused_window_attention import fused_window_attention
from moss_tts.kernels.window_attention import (AttentionConfig, Ring, reference_window_attention, rope_table,
                                               window_attention)
from triton_interpreter import interpreter_json

GARBAGE = 1e4  # ring contents of slots no step row may read
INTERPRETER_TIMEOUT_S = 300

# name -> (heads, head_dim, window, frames T, offsets per row or None (offline), state slots, rows)
INTERPRETER_CASES = {
    "offline_t_below_window": (2, 16, 24, 10, None, 0, None),
    "offline_t_above_window": (2, 16, 8, 70, None, 0, None),
    "offline_many_blocks": (2, 32, 40, 150, None, 0, None),
    "fresh_rows": (2, 16, 24, 10, [0, 0], 4, [2, 0]),
    "ring_partly_filled": (2, 16, 24, 5, [7, 3, 11], 5, [4, 1, 2]),
    "ring_wrapped": (2, 16, 24, 6, [100, 51, 24], 5, [0, 3, 1]),
    "chunk_longer_than_window": (2, 16, 8, 30, [13, 0, 5], 4, [3, 0, 1]),
    "one_query": (2, 16, 40, 1, [0, 39, 40, 1000], 6, [5, 4, 0, 2]),
    "block_m_64_ring": (2, 16, 64, 70, [200, 63], 3, [1, 2]),
    "d64_big_window": (4, 64, 125, 20, [130, 7], 3, [0, 2]),
    # stream positions past the int32 range: the kernels keep only the slot and the history
    "positions_past_int32": (2, 16, 24, 6, [2**31 + 3, 2**33 + 5, 7], 4, [0, 3, 1]),
    # a window past two key tiles: the default 64 x 64 tiles have unmasked tiles between the
    # masked edges (full history, history shorter than the window, a fresh row)
    "unmasked_tiles": (2, 16, 200, 70, [500, 90, 0], 4, [0, 2, 1]),
}
TOLERANCE = 1e-4  # fp32 on both sides


def make_case(heads, head_dim, window, t, offsets, num_slots, rows, dtype=torch.float32, device="cpu", seed=0):
    """qkv [n, T, 3*H*Dh], a Rope table for the rows' positions, and a Ring over `num_slots` slots
    whose contents are random where a row may read them and GARBAGE elsewhere (or None)."""
    gen = torch.Generator().manual_seed(seed)
    n = 3 if offsets is None else len(offsets)
    qkv = torch.randn(n, t, 3 * heads * head_dim, generator=gen)
    if offsets is None:
        rope = rope_table(torch.arange(t)[None], head_dim, 10000.0)
        return qkv.to(device, dtype), rope_on(rope, device), None
    offsets_t = torch.tensor(offsets)
    rope = rope_table(offsets_t[:, None] + torch.arange(t), head_dim, 10000.0)
    keys, values = (torch.full((num_slots, heads, window, head_dim), GARBAGE) for _ in range(2))
    for row, offset in zip(rows, offsets):
        written = min(offset, window)  # the positions offset-written .. offset-1 are in the ring
        for p in range(offset - written, offset):
            keys[row, :, p % window] = torch.randn(heads, head_dim, generator=gen)
            values[row, :, p % window] = torch.randn(heads, head_dim, generator=gen)
    ring = Ring(keys.to(device, dtype), values.to(device, dtype), torch.tensor(rows, device=device),
                offsets_t.to(device))
    return qkv.to(device, dtype), rope_on(rope, device), ring


def rope_on(rope, device):
    return type(rope)(rope.cos.to(device), rope.sin.to(device))


def clone_ring(ring):
    return Ring(ring.keys.clone(), ring.values.clone(), ring.rows, ring.offsets)


def attend(qkv, rope, heads, window, ring, config: AttentionConfig | None = None, ring_kernel: str = "split"):
    """The kernels under test: window_attention (or, with `config`, the Triton path at other tiles
    than attention_config picks), or with ring_kernel "fused" fused_window_attention."""
    if ring_kernel == "fused":
        return fused_window_attention(qkv, rope, heads, window, ring, None, config)
    if config is None:
        return window_attention(qkv, rope, heads, window, ring)
    return wa._triton_window_attention(qkv, rope, heads, window, ring, None, config)


def case_errors(case, device="cpu", dtype=torch.float32, seed=0, config: AttentionConfig | None = None,
                ring_kernel: str = "split") -> dict[str, float]:
    """Max abs error of the kernels' output and of every ring slot after the step, against the
    reference computed in fp32 from the same (rounded) inputs."""
    heads, head_dim, window, t, offsets, num_slots, rows = case
    qkv, rope, ring = make_case(heads, head_dim, window, t, offsets, num_slots, rows, dtype, device, seed)
    # copies: .float() of an fp32 tensor is the tensor itself, and the reference writes its ring
    ref_ring = None if ring is None else Ring(ring.keys.float().clone(), ring.values.float().clone(), ring.rows,
                                              ring.offsets)
    expected = reference_window_attention(qkv.float(), rope, heads, window, ref_ring)
    got = attend(qkv.clone(), rope, heads, window, ring, config, ring_kernel)
    assert got.shape == (qkv.shape[0], t, heads * head_dim) and got.dtype == dtype
    errors = {"out": (got.float() - expected).abs().max().item()}
    if ring is not None:
        errors["keys"] = (ring.keys.float() - ref_ring.keys).abs().max().item()
        errors["values"] = (ring.values.float() - ref_ring.values).abs().max().item()
    return errors


# Tiles other than the defaults, so odd tile shapes (keys per tile below and above the queries
# per block: the masked edge spans one tile or several) stay correct whichever attention_config
# picks: (block_m, block_n, warps, stages).
OTHER_CONFIGS = {"m16_n64": AttentionConfig(16, 64, 4, 2), "m32_n16": AttentionConfig(32, 16, 4, 2),
                 "m16_n16": AttentionConfig(16, 16, 4, 2)}


def repeated_row_errors(config: AttentionConfig | None = None, ring_kernel: str = "split") -> dict[str, float]:
    """Two step rows on one ring row (CUDA-graph padding on the scratch row) beside a real row:
    the real row's output and ring are exact and no other ring row changes."""
    heads, window = 2, 24
    qkv, rope, ring = make_case(heads, 16, window, 6, [30, 2**31 + 3, 2**31 + 3], 4, [0, 2, 2])
    ref_ring = clone_ring(ring)
    expected = reference_window_attention(qkv, rope, heads, window, ref_ring)
    got = attend(qkv.clone(), rope, heads, window, ring, config, ring_kernel)
    others = [1, 3]  # never decoded: still all GARBAGE
    return {"out": (got[0] - expected[0]).abs().max().item(),
            "keys": (ring.keys[0] - ref_ring.keys[0]).abs().max().item(),
            "values": (ring.values[0] - ref_ring.values[0]).abs().max().item(),
            "others": max((ring.keys[others] - GARBAGE).abs().max().item(),
                          (ring.values[others] - GARBAGE).abs().max().item())}


# Packed steps (rows of different lengths back to back in one sequence): name -> (heads,
# head_dim, window, tokens per row, offsets per row, state slots, rows, padding tokens at the end,
# max_len). A row of 0 tokens is a graph's padding row (here on slot `rows` repeats, untouched).
PACKED_CASES = {
    "packed_mixed_lengths": (2, 16, 24, [2, 10, 4], [7, 100, 0], 5, [4, 1, 2], 3, 10),
    "packed_padding_rows": (2, 16, 24, [3, 0, 0, 9], [30, 0, 0, 5], 5, [0, 4, 4, 2], 7, 10),
    "packed_longer_than_window": (2, 16, 8, [20, 3], [13, 2**31 + 3], 4, [3, 1], 0, 20),
    "packed_block_m_64": (2, 32, 64, [70, 5, 40], [200, 63, 0], 4, [1, 2, 0], 9, 80),
    "packed_unmasked_tiles": (2, 16, 200, [70, 3, 130], [500, 90, 0], 4, [0, 2, 1], 5, 130),
}


def make_packed_case(case, device="cpu", dtype=torch.float32, seed=0):
    """qkv [1, N + pad, 3*H*Dh] of the rows' tokens back to back, then `pad` padding tokens of
    NaN (a kernel that read one would spread it into a row's outputs), the Rope table of every
    token's own position, and a packed Ring whose slots a row may read are random (GARBAGE
    elsewhere)."""
    heads, head_dim, window, lengths, offsets, num_slots, rows, pad, max_len = case
    gen = torch.Generator().manual_seed(seed)
    width = 3 * heads * head_dim
    qkvs = [torch.randn(1, n, width, generator=gen) for n in lengths] + [torch.full((1, pad, width), float("nan"))]
    keys, values = (torch.full((num_slots, heads, window, head_dim), GARBAGE) for _ in range(2))
    for row, offset, n in zip(rows, offsets, lengths):
        if n:
            for p in range(offset - min(offset, window), offset):
                keys[row, :, p % window] = torch.randn(heads, head_dim, generator=gen)
                values[row, :, p % window] = torch.randn(heads, head_dim, generator=gen)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    # padding at positions other than 0 (an identity rotation), so a kernel that rotated one shows
    positions = [offset + j for offset, n in zip(offsets, lengths) for j in range(n)] + list(range(1, pad + 1))
    rope = rope_on(rope_table(torch.tensor([positions]), head_dim, 10000.0), device)
    ring = Ring(keys.to(device, dtype), values.to(device, dtype), torch.tensor(rows, device=device),
                torch.tensor(offsets, device=device), torch.tensor(starts, device=device),
                torch.tensor(lengths, device=device), max_len)
    return torch.cat(qkvs, dim=1).to(device, dtype), rope, ring


def packed_case_errors(case, device="cpu", dtype=torch.float32, seed=0, config: AttentionConfig | None = None,
                       ring_kernel: str = "split") -> dict[str, float]:
    """Max abs error of a packed step against the batched reference run row by row (its own
    oracle): every row's outputs and every ring slot. The padding tokens' outputs are reported for
    the reference (which zeroes them); the kernel leaves them unwritten (any value)."""
    heads, head_dim, window, lengths, offsets, num_slots, rows, pad, max_len = case
    packed, rope, ring = make_packed_case(case, device, dtype, seed)
    # the oracle sees the same rounded inputs
    ref = Ring(ring.keys.float().cpu().clone(), ring.values.float().cpu().clone(), None, None)
    starts = ring.starts.tolist()
    expected = []
    for row, offset, n, start in zip(rows, offsets, lengths, starts):
        if n:
            row_rope = rope_table(torch.tensor([[offset + j for j in range(n)]]), head_dim, 10000.0)
            row_ring = Ring(ref.keys, ref.values, torch.tensor([row]), torch.tensor([offset]))
            qkv = packed[:, start:start + n].float().cpu()
            expected.append(reference_window_attention(qkv, row_rope, heads, window, row_ring)[0])
    got = attend(packed.clone(), rope, heads, window, ring, config, ring_kernel)
    got = got[0].float().cpu()
    total = sum(lengths)
    assert got.shape == (total + pad, heads * head_dim)
    return {"out": max((got[start:start + n] - e).abs().max().item()
                       for start, n, e in zip([s for s, n in zip(starts, lengths) if n], [n for n in lengths if n], expected)),
            "padding": got[total:].abs().max().item() if pad else 0.0,
            "keys": (ring.keys.float().cpu() - ref.keys).abs().max().item(),
            "values": (ring.values.float().cpu() - ref.values).abs().max().item()}


def interpreter_main() -> None:
    errors = {name: case_errors(case) for name, case in INTERPRETER_CASES.items()}
    for name, case in PACKED_CASES.items():
        errors[name] = packed_case_errors(case)
        errors.update({f"{name}/{label}": packed_case_errors(case, config=config) for label, config in OTHER_CONFIGS.items()})
    errors["repeated_rows"] = repeated_row_errors()
    errors["repeated_rows/m16_n64"] = repeated_row_errors(OTHER_CONFIGS["m16_n64"])
    for label, config in OTHER_CONFIGS.items():
        errors.update({f"{name}/{label}": case_errors(case, config=config) for name, case in INTERPRETER_CASES.items()})
    print(json.dumps(errors))


@pytest.fixture(scope="module")
def interpreter_errors() -> dict[str, dict[str, float]]:
    return interpreter_json("test_window_attention", INTERPRETER_TIMEOUT_S)


@pytest.mark.parametrize("config", [None, *OTHER_CONFIGS])
@pytest.mark.parametrize("name", list(INTERPRETER_CASES))
def test_interpreter_kernels_match_reference(interpreter_errors, name, config):
    errors = interpreter_errors[name if config is None else f"{name}/{config}"]
    assert set(errors) == ({"out"} if INTERPRETER_CASES[name][4] is None else {"out", "keys", "values"})
    assert all(e <= TOLERANCE for e in errors.values()), errors


@pytest.mark.parametrize("config", [None, *OTHER_CONFIGS])
@pytest.mark.parametrize("name", list(PACKED_CASES))
def test_interpreter_packed_rows_match_each_row_alone(interpreter_errors, name, config):
    errors = interpreter_errors[name if config is None else f"{name}/{config}"]
    # tokens no row owns are never written (their values are the allocator's): not checked
    assert all(errors[key] <= TOLERANCE for key in ("out", "keys", "values")), errors


@pytest.mark.parametrize("name", list(PACKED_CASES))
def test_reference_packed_rows_match_each_row_alone(name):
    errors = packed_case_errors(PACKED_CASES[name])
    assert errors["padding"] == 0.0 and all(errors[key] <= TOLERANCE for key in ("out", "keys", "values")), errors


@pytest.mark.parametrize("name", ["repeated_rows", "repeated_rows/m16_n64"])
def test_interpreter_repeated_rows_touch_only_their_ring_row(interpreter_errors, name):
    errors = interpreter_errors[name]
    assert errors["others"] == 0.0, errors
    assert all(errors[key] <= TOLERANCE for key in ("out", "keys", "values")), errors


# No bf16 case on the interpreter: Triton 3.6's interpreter multiplies bf16 tl.dot operands as
# their raw bits (see test_decode_attention.py); bf16 is checked by the GPU tests below.


# ------------------------------------------------------------------ the reference's own contract
@pytest.mark.parametrize("chunks", [[1] * 12, [5, 7], [2, 10], [3, 1, 8]])
def test_reference_streaming_in_chunks_equals_offline(chunks):
    heads, head_dim, window, total = 2, 16, 5, sum(chunks)
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, total, 3 * heads * head_dim, generator=gen, dtype=torch.float64)
    offline = reference_window_attention(qkv, rope_table(torch.arange(total)[None], head_dim, 1e4), heads, window)
    # Finite garbage: the reference's masked SDPA multiplies masked values by 0 (0 * NaN = NaN);
    # the state starts and restarts zeroed, so its rings only ever hold finite values.
    keys, values = (torch.full((4, heads, window, head_dim), GARBAGE, dtype=torch.float64) for _ in range(2))
    rows, start, out = torch.tensor([3, 1]), 0, []
    for size in chunks:
        offsets = torch.full((2,), start)
        rope = rope_table(offsets[:, None] + torch.arange(size), head_dim, 1e4)
        ring = Ring(keys, values, rows, offsets)
        out.append(reference_window_attention(qkv[:, start:start + size], rope, heads, window, ring))
        start += size
    torch.testing.assert_close(torch.cat(out, dim=1), offline, rtol=0, atol=1e-12)
    assert (keys[[0, 2]] == GARBAGE).all() and (values[[0, 2]] == GARBAGE).all()  # rows not decoded: untouched


def test_cpu_falls_back_to_the_reference():
    qkv, rope, ring = make_case(*INTERPRETER_CASES["ring_wrapped"])
    ref_ring = clone_ring(ring)
    expected = reference_window_attention(qkv, rope, 2, 24, ref_ring)
    assert torch.equal(window_attention(qkv, rope, 2, 24, ring), expected)
    assert torch.equal(ring.keys, ref_ring.keys) and torch.equal(ring.values, ref_ring.values)


# ------------------------------------------------------------------ GPU, real head size, bf16
# The real codec: heads 20 (d 1280, window 125) and 12 (d 768, windows 250/400), head_dim 64.
GPU_CASES = {
    "stage0_2_frames": (20, 64, 125, 2, [0, 7, 300], 9, [8, 0, 3]),
    "stage0_10_frames": (20, 64, 125, 10, [120, 1, 5000], 5, [1, 4, 0]),
    "stage5_10_frames": (12, 64, 400, 320, [0, 320, 7040, 64], 6, [5, 1, 2, 0]),
    "stage5_long_chunk": (12, 64, 400, 1000, [30, 800], 3, [2, 0]),
    "stage1_offline": (12, 64, 250, 600, None, 0, None),
}
BF16_TOLERANCE = 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_kernels_match_reference_bf16(name):
    errors = case_errors(GPU_CASES[name], device="cuda", dtype=torch.bfloat16)
    assert all(e <= BF16_TOLERANCE for e in errors.values()), errors


# Packed rows at the real head size: a vocoder round of 2-, 10- and 4-frame chunks at stage 0
# (1 token per frame, window 125) and at stage 5 (32 tokens per frame, window 400).
GPU_PACKED_CASES = {
    "stage0_packed": (20, 64, 125, [2, 10, 4, 0], [0, 300, 7, 0], 6, [5, 1, 2, 5], 6, 10),
    "stage5_packed": (12, 64, 400, [64, 320, 128, 0], [7040, 0, 320, 0], 6, [0, 4, 2, 0], 32, 320),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_PACKED_CASES))
def test_gpu_packed_kernels_match_each_row_alone_bf16(name):
    errors = packed_case_errors(GPU_PACKED_CASES[name], device="cuda", dtype=torch.bfloat16)
    assert all(errors[key] <= BF16_TOLERANCE for key in ("out", "keys", "values")), errors


@pytest.mark.gpu
def test_gpu_float32_kernels_are_not_tf32():
    errors = case_errors(GPU_CASES["stage5_10_frames"], device="cuda", dtype=torch.float32)
    assert all(e <= 1e-4 for e in errors.values()), errors
