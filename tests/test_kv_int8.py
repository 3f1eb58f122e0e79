"""The backbone's KV cache in int8 with a scale per (token, KV head) (kernels/kv_format.py,
EngineConfig.kv_cache_dtype="int8"): the store rule, the row layout that keeps each head's scale
beside its values, that every writer stores exactly that and every reader applies the scales, on
CPU (torch paths; the kernels through Triton's interpreter, one subprocess) and on a GPU at the
model's real sizes. An engine serving on it: test_kv_fp8.py, for both byte caches. The
interpreter's cases stay in fp32: Triton 3.6's interpreter casts int8 to bf16 wrongly (NaN for
negatives), which compiled kernels do not."""

from __future__ import annotations

import pytest
import torch

from moss_tts.engine import EngineConfig
from moss_tts.engine.kv_cache import StaticKVCache
from moss_tts.kernels import decode_attention, kv_format, prefill_attention, step_qkv
from test_decode_attention import make_inputs
from test_kv_fp8 import _hidden, loud_values
from test_step_qkv import decode_inputs, prefill_inputs
from triton_interpreter import interpreter_json, relative_error

I8 = torch.int8
INTERPRETER_TIMEOUT_S = 300


def int8_cache(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, rows, kv_heads, d] stored as an int8 cache: (values, scales) views over one buffer of
    rows, laid out as StaticKVCache's (the scales inside each row)."""
    return kv_format.split_rows(kv_format.to_rows(x, I8), x.shape[-2], x.shape[-1])


def stored_diff(got: tuple, expected: tuple) -> dict:
    """Two int8 caches (values, scales), over the heads either wrote (a nonzero scale): the share of
    values that differ, by how many steps at most, and the scales' relative error."""
    written = (got[1] != 0) | (expected[1] != 0)
    values, expected_values = got[0][written].int(), expected[0][written].int()
    return {"share": (values != expected_values).float().mean().item(),
            "steps": (values - expected_values).abs().max().item(), "scales": relative_error(got[1], expected[1])}


def int8_qkv_errors(kind: str, device: str = "cpu", real: bool = False) -> dict:
    """decode_qkv / prefill_qkv into int8 caches against their torch references into int8 caches."""
    heads, kv_heads, head_dim, dtype = (32, 8, 128, "bfloat16") if real else (4, 2, 16, "float32")
    if kind == "decode":
        qkv, qw, kw, cos, sin, k, v, positions = decode_inputs(256 if real else 3, heads, kv_heads, head_dim,
                                                               dtype, device)
        where = (positions,)
    else:
        qkv, qw, kw, cos, sin, k, v, slots, rows = prefill_inputs(128 if real else 3, 16 if real else 5, heads,
                                                                  kv_heads, head_dim, dtype, device)
        where = (slots, rows)
    qkv = loud_values(qkv, kv_heads, head_dim)  # values far past fp8's range: int8's scale takes them
    caches = [int8_cache(torch.zeros_like(x)) for x in (k, v, k, v)]
    run, reference = ((step_qkv.decode_qkv, step_qkv.reference_decode_qkv) if kind == "decode"
                      else (step_qkv.prefill_qkv, step_qkv.reference_prefill_qkv))
    (k, ks), (v, vs), (rk, rks), (rv, rvs) = caches
    expected = reference(qkv, qw, kw, 1e-6, cos, sin, rk, rv, *where, heads, kv_heads, (rks, rvs))
    got = run(qkv, qw, kw, 1e-6, cos, sin, k, v, *where, heads, kv_heads, (ks, vs))
    return {"q": relative_error(got, expected), "k": stored_diff((k, ks), (rk, rks)),
            "v": stored_diff((v, vs), (rv, rvs)), "written": (rk != 0).float().mean().item()}


def int8_attention_errors(device: str = "cpu", real: bool = False) -> dict:
    """Both attention kernels reading int8 caches, against their references on the same caches,
    and how far the cache itself moves the reference from the exact cache's."""
    heads, kv_heads, head_dim = (32, 8, 128) if real else (8, 2, 32)
    dtype = torch.bfloat16 if real else torch.float32
    lengths = [200, 1, 65, 130, 37] * (51 if real else 1)
    q, k, v, lens = make_inputs(heads, kv_heads, head_dim, lengths, 200, dtype, device)
    k, v = k * 30, v * 5  # far from one: the scales must be applied, not assumed
    (kq, ks), (vq, vs) = int8_cache(k), int8_cache(v)
    scales = (ks, vs)
    # in fp32: the reference's keys and values rounded to bf16 after their scales would differ from
    # the cache's by more than the kernel does (it applies the scales to fp32 scores and weights)
    expected = decode_attention.reference_attention(q.float(), kq, vq, lens, 200, kv_scales=scales)
    fp16 = decode_attention.DecodeConfig(fp16_dots=True)  # the tiles widen to fp16, as fp8's do
    errors = {"decode": relative_error(decode_attention.decode_attention(q, kq, vq, lens, 200,  # INT8_CONFIG
                                                                         kv_scales=scales), expected),
              "decode_fp16_dots": relative_error(decode_attention.decode_attention(q, kq, vq, lens, 200, config=fp16,
                                                                                   kv_scales=scales), expected),
              "cache": relative_error(expected, decode_attention.reference_attention(q.float(), k.float(), v.float(),
                                                                                     lens, 200))}
    n = len(lengths)
    slots = torch.arange(n, device=device)
    starts = (lens - 9).clamp(min=0)  # each prompt's last (up to) 9 rows are this launch's queries
    pq = torch.randn(n, 9, heads, head_dim, generator=torch.Generator().manual_seed(4)).to(device, dtype)
    got = prefill_attention.prefill_attention(pq, kq, vq, slots, starts, lens, kv_scales=scales)
    errors["prefill"] = relative_error(got, prefill_attention.reference_prefill_attention(pq.float(), kq, vq, slots,
                                                                                           starts, lens, kv_scales=scales))
    return errors


def int8_block_copy_equal() -> bool:
    """The prefix pool's one-launch copies (kernels/block_copy.py) of an int8 cache move whole rows:
    values and scales."""
    cache = StaticKVCache(2, 3, 32, 2, 16, prefix_blocks=4, prefix_block_rows=8)
    cache.setup(torch.device("cpu"), I8)
    for layer in range(2):
        cache.write_prompts(layer, torch.arange(3), torch.randn(3, 32, 2, 16) * 30, torch.randn(3, 32, 2, 16))
    before = [t.clone() for t in cache.k + cache.v + cache.k_scale + cache.v_scale]
    cache.copy_prefixes(2, torch.tensor([cache.slot_block(1, 0), cache.slot_block(1, 2)]), torch.tensor([3, 0]),
                        into_slots=False, one_launch=True)  # slot 1's blocks 0 and 2 -> pool
    cache.copy_prefixes(2, torch.tensor([cache.slot_block(2, 1), cache.slot_block(2, 3)]), torch.tensor([3, 0]),
                        into_slots=True, one_launch=True)  # -> slot 2's blocks 1 and 3
    after = cache.k + cache.v + cache.k_scale + cache.v_scale
    moved = all(torch.equal(a[2, 8 * dst:8 * dst + 8], b[1, 8 * src:8 * src + 8])
                for a, b in zip(after, before) for src, dst in ((0, 1), (2, 3)))
    return moved and all(torch.equal(a[:2], b[:2]) for a, b in zip(after, before))


def interpreter_main() -> None:
    import json

    print(json.dumps({"decode_qkv": int8_qkv_errors("decode"), "prefill_qkv": int8_qkv_errors("prefill"),
                      "attention": int8_attention_errors(), "block_copy": int8_block_copy_equal()}))


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    return interpreter_json("test_kv_int8", INTERPRETER_TIMEOUT_S)


def check_qkv(errors: dict, dtype: str) -> None:
    assert errors["q"] <= {"float32": 1e-5, "bfloat16": 2e-2}[dtype], errors  # q is not stored: as with any cache
    assert errors["written"] > 0, errors
    # A value reaches both paths as the same number: the same scale, and the same steps, but where
    # the GPU fuses x * inv + 0.5 into one rounding (torch rounds twice) a value a hair from a
    # half step may land one step away.
    assert errors["v"]["scales"] == 0.0 and errors["v"]["steps"] <= 1, errors
    assert errors["v"]["share"] <= {"float32": 0.0, "bfloat16": 1e-4}[dtype], errors
    # A key is normed and rotated by both, which may differ in its last bit (fp32) or a few (bf16:
    # up to 2e-2 relative in test_step_qkv): then its head's scale moves, and values a few steps.
    limits = {"float32": (1, 1e-3, 1e-6), "bfloat16": (4, 0.25, 2e-2)}[dtype]
    assert errors["k"]["steps"] <= limits[0] and errors["k"]["share"] <= limits[1], errors
    assert errors["k"]["scales"] <= limits[2], errors


@pytest.mark.parametrize("kind", ["decode_qkv", "prefill_qkv"])
def test_interpreter_qkv_kernels_store_what_the_torch_path_stores(interpreter_results, kind):
    check_qkv(interpreter_results[kind], "float32")


def test_interpreter_attention_kernels_apply_the_scales(interpreter_results):
    errors = interpreter_results["attention"]
    # fp32 both sides; keys of ~30 make large logits, whose rounding the softmax amplifies (a scale
    # not applied would be off by O(1))
    assert errors["decode"] <= 1e-4 and errors["prefill"] <= 1e-4, errors
    # fp16 dots: q and the weights (times the values' scales) rounded to fp16; the int8 values are exact in it
    assert 0 < errors["decode_fp16_dots"] <= 5e-3, errors
    assert 1e-4 < errors["cache"] < 5e-2, errors  # the cache's own rounding: there, and small


def test_an_int8_cache_launches_its_own_tile_with_dots_in_q_dtype():
    config = decode_attention.INT8_CONFIG
    assert config != decode_attention.DEFAULT_CONFIG and not config.fp16_dots


def test_interpreter_prefix_copies_move_values_and_scales(interpreter_results):
    assert interpreter_results["block_copy"] is True


def test_a_write_stores_each_head_with_its_scale():
    x = torch.tensor([[2.0, -1.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [-0.3, 0.1, 0.2, 0.05]])
    values, scales = kv_format.quantize(x)
    # 127 / max|x| times x, plus one half, floored (so -63.5 goes to -63); a zero head stores zeros, scale 0
    assert values.tolist() == [[127, -63, 32, 0], [0, 0, 0, 0], [-127, 42, 85, 21]]
    assert torch.equal(scales, torch.tensor([2.0, 0.0, 0.3]) / 127)
    assert not kv_format.from_cache(values, torch.float32, scales).isnan().any()
    with pytest.raises(TypeError, match="to_rows"):
        kv_format.to_cache(x, I8)


def test_a_row_holds_its_heads_then_their_scales():
    assert kv_format.row_elements(8, 128, I8) == 8 * 128 + 8 * 4 == 1056  # 16-byte aligned rows
    assert kv_format.row_elements(8, 128, torch.bfloat16) == 8 * 128
    x = torch.randn(3, 5, 2, 16)
    rows = kv_format.to_rows(x, I8)
    values, scales = kv_format.split_rows(rows, 2, 16)
    assert rows.shape == (3, 5, 40) and values.data_ptr() == rows.data_ptr()
    expected_values, expected_scales = kv_format.quantize(x)
    assert torch.equal(values, expected_values) and torch.equal(scales, expected_scales)
    assert torch.equal(rows[..., 32:].contiguous().view(torch.float32), expected_scales)
    assert relative_error(kv_format.round_trip(x, I8), x) < 0.01


def test_cache_dtypes_and_their_sizes():
    assert kv_format.cache_dtype("int8", torch.bfloat16) == I8
    cache = StaticKVCache(4, 3, 64, 8, 128, prefix_blocks=2)
    assert cache.num_bytes(I8) == cache.num_bytes(torch.float8_e4m3fn) * 1056 // 1024
    assert EngineConfig.from_parameters({"kv_cache_dtype": "int8"}).kv_cache_dtype == "int8"


def test_the_cache_stores_the_quantized_rows_on_every_write_path():
    cache = StaticKVCache(1, 4, 16, 2, 8)
    cache.setup(torch.device("cpu"), I8)
    k_scale, v_scale = cache.scales(0)
    assert cache.dtype == I8 and k_scale is cache.k_scale[0] and v_scale is cache.v_scale[0]
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 5, 2, 8, generator=gen) * 500, torch.randn(2, 5, 2, 8, generator=gen)
    cache.write_prompts(0, torch.tensor([3, 1]), k, v)
    keys, _ = cache.gather(0, torch.tensor([3, 1]), 5, torch.float32)
    assert torch.equal(keys, kv_format.round_trip(k, I8))
    step_k = torch.randn(2, 2, 8, generator=gen)
    cache.write_step(0, torch.tensor([0, 2]), torch.tensor([7, 0]), step_k, step_k)
    _, values = cache.window(0, 4, 16, torch.float32)
    assert torch.equal(values[2, 0], kv_format.round_trip(step_k[1], I8))
    keys, values = cache.write_range(0, 1, 5, k[:1, :3], v[:1, :3])  # returned widened, for attention
    assert keys.dtype == torch.float32 and keys.shape == (1, 8, 2, 8)
    assert torch.equal(keys[0, 5:], kv_format.round_trip(k[0, :3], I8))
    assert torch.equal(keys[0, :5], kv_format.round_trip(k[1], I8))  # write_prompts' rows, still there
    assert torch.equal(cache.as_stored(step_k), kv_format.round_trip(step_k, I8))
    # the exact cache has no scales and stores what it is given
    exact = StaticKVCache(1, 2, 8, 2, 8)
    exact.setup(torch.device("cpu"), torch.float32)
    assert exact.scales(0) is None and exact.as_stored(step_k) is step_k


def test_the_backbone_reads_back_the_int8_cache_closer_than_fp8(tiny_model):
    exact = _hidden(tiny_model, torch.float32)
    error = relative_error(_hidden(tiny_model, I8), exact)
    fp8_error = relative_error(_hidden(tiny_model, torch.float8_e4m3fn), exact)
    assert 0.0 < error < fp8_error, (error, fp8_error)  # it is read, and it is the closer of the two


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_gpu_qkv_kernels_store_what_the_torch_path_stores(kind):
    check_qkv(int8_qkv_errors(kind, "cuda", real=True), "bfloat16")


@pytest.mark.gpu
def test_gpu_attention_kernels_apply_the_scales():
    errors = int8_attention_errors("cuda", real=True)
    assert errors["decode"] <= 2e-2 and errors["decode_fp16_dots"] <= 2e-2 and errors["prefill"] <= 2e-2, errors
