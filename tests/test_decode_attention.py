"""The flash-decoding kernel against its masked-SDPA reference: on CPU through Triton's
interpreter (tiny shapes, one subprocess, since TRITON_INTERPRET must be set before triton is
imported), the CPU fallback, and on a GPU at the model's real sizes."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from moss_tts.kernels.decode_attention import DecodeConfig, decode_attention, reference_attention, split_plan
from triton_interpreter import interpreter_json

GARBAGE = 1e4  # cache rows no slot may read: large enough to show up in any result that read one
INTERPRETER_TIMEOUT_S = 300

# name -> (heads, kv_heads, head_dim, lengths, max_len, num_splits, dtype, extra); lengths not
# multiples of the default tile (DecodeConfig.block_n, 64) on purpose, and always one slot at 1 or at exactly max_len
INTERPRETER_CASES = {
    **{f"d16_s{len(lens)}_splits{splits}": (4, 2, 16, lens, 150, splits, "float32", "")
       for lens in ([150], [1, 150, 77], [150, 1, 65, 130, 37])
       for splits in (None, 1, 2, 3, 5)},  # 5 > the window's 3 tiles: wholly empty splits
    "d32_s3_auto": (4, 2, 32, [1, 150, 77], 150, None, "float32", ""),
    "d32_s3_splits2": (4, 2, 32, [1, 150, 77], 150, 2, "float32", ""),
    **{f"g4_d64_s{len(lens)}_splits{splits}": (8, 2, 64, lens, 150, splits, "float32", "")
       for lens in ([150], [1, 150, 77], [150, 1, 65, 130, 37])
       for splits in (None, 1, 3)},
    "window_below_one_tile": (4, 2, 16, [40, 1, 23], 40, None, "float32", ""),
    "random_lengths": (8, 2, 32, "random", 200, None, "float32", ""),
    "scale_0.3": (4, 2, 16, [1, 150, 77], 150, 2, "float32", "scale"),
    "strided_cache": (4, 2, 16, [1, 150, 77], 150, 2, "float32", "strided"),
    "fp16_splits1": (8, 2, 64, [150, 1, 65, 130, 37], 150, 1, "float16", ""),
    "fp16_splits3": (8, 2, 64, [150, 1, 65, 130, 37], 150, 3, "float16", ""),
    # Other tiles than the default 64 keys (DecodeConfig.block_n; the H200 sweep's candidates):
    # lengths that end inside a tile, splits that are whole tiles, wholly empty splits.
    **{f"block{block}_splits{splits}": (8, 2, 32, [150, 1, 65, 130, 37], 150, splits, "float32", f"block{block}")
       for block in (32, 128) for splits in (None, 1, 3)},
    # DecodeConfig.heads_first (served since round 22; the block cases run it too): one slot's KV heads
    # first. Every other case runs the slot-major grid (heads_first=False)
    **{f"heads_first_splits{splits}": (8, 2, 32, [150, 1, 65, 130, 37], 150, splits, "float32", "heads_first")
       for splits in (None, 1, 3)},
}
TOLERANCE = {"float32": 1e-4, "float16": 5e-3}


def make_inputs(heads: int, kv_heads: int, head_dim: int, lengths, max_len: int, dtype: torch.dtype,
                device: str = "cpu", num_cache_slots: int | None = None, strided: bool = False, seed: int = 0):
    """q [S, heads, d] and a whole cache (more slots than S, rows past max_len) that holds
    GARBAGE everywhere but each slot's rows [0, lengths[s])."""
    gen = torch.Generator().manual_seed(seed)
    if lengths == "random":
        lengths = torch.randint(1, max_len + 1, (5,), generator=gen).tolist()
    num_slots = len(lengths)
    shape = (num_cache_slots or num_slots + 2, max_len + 40, kv_heads, head_dim)
    if strided:  # a [N, T, d, kv] buffer seen as [N, T, kv, d]: no dimension is contiguous as usual
        caches = [torch.full((*shape[:2], head_dim, kv_heads), GARBAGE).transpose(2, 3) for _ in range(2)]
    else:
        caches = [torch.full(shape, GARBAGE) for _ in range(2)]
    for cache in caches:
        for s, n in enumerate(lengths):
            cache[s, :n] = torch.randn(n, kv_heads, head_dim, generator=gen)
    q = torch.randn(num_slots, heads, head_dim, generator=gen)
    k_cache, v_cache = (c.to(device=device, dtype=dtype) for c in caches)
    return q.to(device=device, dtype=dtype), k_cache, v_cache, torch.tensor(lengths, device=device)


def max_error(out: torch.Tensor, q, k_cache, v_cache, lengths, max_len: int, scale=None) -> float:
    """Max abs difference from the reference computed in fp32 on the same (rounded) inputs."""
    expected = reference_attention(q.float(), k_cache.float(), v_cache.float(), lengths, max_len, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    return (out.float() - expected).abs().max().item()


def interpreter_main() -> None:
    """Run in a subprocess with TRITON_INTERPRET=1: prints {case: max abs error} as JSON."""
    errors = {}
    for name, (heads, kv_heads, head_dim, lengths, max_len, splits, dtype, extra) in INTERPRETER_CASES.items():
        q, k, v, lens = make_inputs(heads, kv_heads, head_dim, lengths, max_len, getattr(torch, dtype),
                                    strided=extra == "strided")
        scale = 0.3 if extra == "scale" else None
        config = DecodeConfig(block_n=int(extra[5:])) if extra.startswith("block") else \
            DecodeConfig(heads_first=extra == "heads_first")
        out = decode_attention(q, k, v, lens, max_len, scale, num_splits=splits, config=config)
        errors[name] = max_error(out, q, k, v, lens, max_len, scale)
    print(json.dumps(errors))


@pytest.fixture(scope="module")
def interpreter_errors() -> dict[str, float]:
    return interpreter_json("test_decode_attention", INTERPRETER_TIMEOUT_S)


@pytest.mark.parametrize("name", list(INTERPRETER_CASES))
def test_interpreter_kernel_matches_reference(interpreter_errors, name):
    assert interpreter_errors[name] <= TOLERANCE[INTERPRETER_CASES[name][6]]


# No bf16 case on the interpreter: Triton 3.6's interpreter multiplies bf16 tl.dot operands as their
# raw uint16 bits (create_dot upcasts only fp8), so bf16 is checked by the GPU tests; fp16 covers the
# half-precision casts here.


@pytest.mark.parametrize(("num_slots", "max_len", "expected"), [
    (1, 256, (4, 64)),  # 8 programs per split: every tile its own split
    (1, 5120, (40, 128)),  # 50 wanted, rounded to whole tiles of 80
    (16, 1024, (4, 256)),  # 128 programs per split: 4 reach 3 * 132
    (64, 1024, (1, 1024)),  # 512 programs already fill the GPU
    (3, 40, (1, 64)),  # a window below one tile
])
def test_split_plan(num_slots, max_len, expected):
    assert split_plan(num_slots, 8, max_len, num_sms=132) == expected


def test_split_plan_whole_tiles_of_the_configured_block():
    assert split_plan(1, 8, 256, num_sms=132, config=DecodeConfig(block_n=128)) == (2, 128)
    assert split_plan(3, 2, 150, num_splits=2, config=DecodeConfig(block_n=32)) == (2, 96)


def test_decode_config_is_checked():
    for bad in ({"block_n": 48}, {"block_n": 8}, {"num_warps": 0}, {"num_stages": 0}, {"programs_per_sm": 0}):
        with pytest.raises(ValueError):
            DecodeConfig(**bad)


def test_split_plan_forced_count_is_kept():
    assert split_plan(3, 2, 150, num_splits=5) == (5, 64)  # splits 3 and 4 stay empty


def test_cpu_falls_back_to_reference():
    q, k, v, lengths = make_inputs(4, 2, 16, [1, 150, 77], 150, torch.float32)
    assert torch.equal(decode_attention(q, k, v, lengths, 150), reference_attention(q, k, v, lengths, 150))


def test_reference_equals_the_backbone_masked_sdpa():
    """The grouped masked SDPA that backbone.decode runs over cache.window."""
    q, k_cache, v_cache, lengths = make_inputs(8, 2, 16, [1, 150, 77], 150, torch.float32)
    num_slots, max_len = 3, 150
    keys, values = k_cache[:num_slots, :max_len], v_cache[:num_slots, :max_len]
    grouped = q.reshape(num_slots, 2, 4, 16)
    positions = lengths - 1
    bias = torch.zeros(num_slots, 1, 1, max_len).masked_fill(
        (torch.arange(max_len) > positions.unsqueeze(1))[:, None, None, :], float("-inf"))
    expected = F.scaled_dot_product_attention(grouped, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=bias)
    got = reference_attention(q, k_cache, v_cache, lengths, max_len)
    torch.testing.assert_close(got, expected.reshape(num_slots, 8, 16), rtol=1e-5, atol=1e-5)


# Real sizes (heads 32, kv 8, d 128) on CUDA; the cache always has 256 slots and rows past max_len.
REAL = dict(heads=32, kv_heads=8, head_dim=128)
BF16_TOLERANCE = 2e-2


def real_inputs(num_slots: int, max_len: int, dtype=torch.bfloat16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (num_slots,), generator=gen)
    lengths[0], lengths[-1] = max_len, 1  # both ends, when S > 1
    return make_inputs(lengths=lengths.tolist(), max_len=max_len, dtype=dtype, device="cuda",
                       num_cache_slots=256, seed=seed, **REAL)


@pytest.mark.gpu
@pytest.mark.parametrize("max_len", [256, 1024])
@pytest.mark.parametrize("num_slots", [1, 64, 256])
def test_gpu_kernel_matches_reference(num_slots, max_len):
    q, k, v, lengths = real_inputs(num_slots, max_len)
    assert max_error(decode_attention(q, k, v, lengths, max_len), q, k, v, lengths, max_len) <= BF16_TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3, 16])
def test_gpu_forced_splits(num_splits):
    q, k, v, lengths = real_inputs(4, 1024)
    out = decode_attention(q, k, v, lengths, 1024, num_splits=num_splits)
    assert max_error(out, q, k, v, lengths, 1024) <= BF16_TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("num_slots", [4, 256])
def test_gpu_heads_first_is_the_same_result(num_slots):
    # the same programs in another launch order: the served grid (heads first, the default since
    # round 22) gives the slot-major grid's output bit for bit
    q, k, v, lengths = real_inputs(num_slots, 1024)
    assert DecodeConfig().heads_first
    assert torch.equal(decode_attention(q, k, v, lengths, 1024),
                       decode_attention(q, k, v, lengths, 1024, config=DecodeConfig(heads_first=False)))


@pytest.mark.gpu
def test_gpu_float32_is_not_tf32():
    q, k, v, lengths = real_inputs(8, 512, dtype=torch.float32)
    assert max_error(decode_attention(q, k, v, lengths, 512), q, k, v, lengths, 512) <= 1e-4


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_follows_new_inputs():
    # every slot's whole window holds keys, so any new length reads real rows
    q, k, v, lengths = make_inputs(lengths=[512] * 16, max_len=512, dtype=torch.bfloat16, device="cuda", **REAL)
    new_q, _, _, new_lengths = real_inputs(16, 512, seed=1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        decode_attention(q, k, v, lengths, 512)  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k, v, lengths, 512)
    q.copy_(new_q)
    lengths.copy_(new_lengths)
    graph.replay()
    assert max_error(out, q, k, v, lengths, 512) <= BF16_TOLERANCE
