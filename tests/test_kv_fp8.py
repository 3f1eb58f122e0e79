"""The backbone's KV cache in fp8 e4m3 (kernels/kv_format.py, EngineConfig.kv_cache_dtype): what a
write stores (clamped to +-448, rounded to nearest once), that every writer stores exactly that and
every reader widens it, on CPU (torch paths; the kernels through Triton's interpreter, one
subprocess) and on a GPU at the model's real sizes; and that an engine runs on it."""

from __future__ import annotations

import pytest
import torch

from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine import Engine, EngineConfig, EngineRequest, backbone
from moss_tts.engine.kv_cache import StaticKVCache
from moss_tts.kernels import decode_attention, kv_format, prefill_attention, step_qkv
from moss_tts.kernels.fused import Fusions
from moss_tts.model.processor import PromptSpec
from engine_events import TIMEOUT_S, Collector
from test_decode_attention import make_inputs
from test_step_qkv import decode_inputs, prefill_inputs
from triton_interpreter import interpreter_json, relative_error

FP8 = torch.float8_e4m3fn
INTERPRETER_TIMEOUT_S = 300
# A key is normed and rotated by both paths, which may differ in the last bit of the model's dtype
# (fp32, or bf16 on the GPU: relative errors up to 2e-2 in test_step_qkv): then a key lands on the
# other side of an e4m3 rounding boundary, one step (1/8 of its value) off. The share that may.
KEY_STEPS_OFF = {"float32": 1e-3, "bfloat16": 2e-2}


def cache_diff(got: torch.Tensor, expected: torch.Tensor) -> dict:
    """How two fp8 caches differ by value (+0 and -0 alike): the share of elements that differ, and
    the largest difference relative to the largest value."""
    assert got.dtype == expected.dtype == FP8
    g, e = got.float(), expected.float()
    assert not g.isnan().any(), "a write made NaN: values past +-448 must clamp"
    return {"share": (g != e).float().mean().item(), "rel": relative_error(g, e)}


def loud_values(qkv: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """qkv with some values past e4m3's range in its v part (the tail), to be clamped on the write."""
    qkv = qkv.clone()
    v = qkv[..., -kv_heads * head_dim:]
    v[..., ::7] *= 400.0
    return qkv


def fp8_qkv_errors(kind: str, device: str = "cpu", real: bool = False) -> dict:
    """decode_qkv / prefill_qkv into fp8 caches against their torch references into fp8 caches."""
    heads, kv_heads, head_dim, dtype = (32, 8, 128, "bfloat16") if real else (4, 2, 16, "float32")
    if kind == "decode":
        qkv, qw, kw, cos, sin, k, v, positions = decode_inputs(256 if real else 3, heads, kv_heads, head_dim,
                                                               dtype, device)
        where = (positions,)
    else:
        qkv, qw, kw, cos, sin, k, v, slots, rows = prefill_inputs(128 if real else 3, 16 if real else 5, heads,
                                                                  kv_heads, head_dim, dtype, device)
        where = (slots, rows)
    qkv = loud_values(qkv, kv_heads, head_dim)
    k, v = kv_format.to_cache(k, FP8), kv_format.to_cache(v, FP8)
    ref_k, ref_v = k.clone(), v.clone()
    run, reference = ((step_qkv.decode_qkv, step_qkv.reference_decode_qkv) if kind == "decode"
                      else (step_qkv.prefill_qkv, step_qkv.reference_prefill_qkv))
    expected = reference(qkv, qw, kw, 1e-6, cos, sin, ref_k, ref_v, *where, heads, kv_heads)
    got = run(qkv, qw, kw, 1e-6, cos, sin, k, v, *where, heads, kv_heads)
    clamped = ref_v.float().abs().max().item()
    return {"q": relative_error(got, expected), "k": cache_diff(k, ref_k), "v": cache_diff(v, ref_v),
            "v_max": clamped}


def fp8_attention_errors(device: str = "cpu", real: bool = False) -> dict:
    """Both attention kernels reading fp8 caches, against their references on the same caches."""
    heads, kv_heads, head_dim = (32, 8, 128) if real else (8, 2, 32)
    dtype = torch.bfloat16 if real else torch.float32
    lengths = [200, 1, 65, 130, 37] * (51 if real else 1)
    q, k, v, lens = make_inputs(heads, kv_heads, head_dim, lengths, 200, dtype, device)
    k, v = kv_format.to_cache(k, FP8), kv_format.to_cache(v, FP8)
    expected = decode_attention.reference_attention(q, k, v, lens, 200)
    exact = decode_attention.DecodeConfig(fp16_dots=False)  # the tiles widen to q's dtype
    errors = {"decode": relative_error(decode_attention.decode_attention(q, k, v, lens, 200, config=exact), expected),
              # None: an fp8 cache's own tile, FP8_CONFIG (fp16 dots)
              "decode_fp16_dots": relative_error(decode_attention.decode_attention(q, k, v, lens, 200), expected)}
    n = len(lengths)
    slots = torch.arange(n, device=device)
    starts = (lens - 9).clamp(min=0)  # each prompt's last (up to) 9 rows are this launch's queries
    pq = torch.randn(n, 9, heads, head_dim, device=device, dtype=dtype)
    errors["prefill"] = relative_error(prefill_attention.prefill_attention(pq, k, v, slots, starts, lens),
                                       prefill_attention.reference_prefill_attention(pq, k, v, slots, starts, lens))
    return errors


def fp8_block_copy_equal() -> bool:
    """The prefix pool's one-launch copies (kernels/block_copy.py) of an fp8 cache move its bytes."""
    cache = StaticKVCache(2, 3, 32, 2, 16, prefix_blocks=4, prefix_block_rows=8)
    cache.setup(torch.device("cpu"), FP8)
    for layer in range(2):
        cache.k[layer].copy_(kv_format.to_cache(torch.randn(3, 32, 2, 16) * 30, FP8))
        cache.v[layer].copy_(kv_format.to_cache(torch.randn(3, 32, 2, 16), FP8))
    before = [t.clone() for t in cache.k + cache.v]
    blocks = torch.tensor([cache.slot_block(1, 0), cache.slot_block(1, 2)])
    pool = torch.tensor([3, 0])
    cache.copy_prefixes(2, blocks, pool, into_slots=False, one_launch=True)  # slot 1's blocks -> pool
    cache.copy_prefixes(2, torch.tensor([cache.slot_block(2, 1), cache.slot_block(2, 3)]), pool,
                        into_slots=True, one_launch=True)  # -> slot 2's blocks 1 and 3
    same = all(torch.equal(after.view(torch.uint8)[2, 8 * dst:8 * dst + 8], b.view(torch.uint8)[1, 8 * src:8 * src + 8])
               for after, b in zip(cache.k + cache.v, before) for src, dst in ((0, 1), (2, 3)))
    return same and all(torch.equal(a.view(torch.uint8)[:2], b.view(torch.uint8)[:2])
                        for a, b in zip(cache.k + cache.v, before))


def interpreter_main() -> None:
    import json

    print(json.dumps({"decode_qkv": fp8_qkv_errors("decode"), "prefill_qkv": fp8_qkv_errors("prefill"),
                      "attention": fp8_attention_errors(), "block_copy": fp8_block_copy_equal()}))


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    return interpreter_json("test_kv_fp8", INTERPRETER_TIMEOUT_S)


def check_qkv(errors: dict, dtype: str) -> None:
    assert errors["q"] <= {"float32": 1e-5, "bfloat16": 2e-2}[dtype], errors  # q is not stored: as with any cache
    assert errors["v"]["share"] == 0.0, errors  # a value is only clamped and rounded: exactly the reference
    assert errors["k"]["share"] <= KEY_STEPS_OFF[dtype] and errors["k"]["rel"] <= 0.07, errors
    assert errors["v_max"] == kv_format.FP8_E4M3_MAX, errors  # the loud values were clamped, not NaN


@pytest.mark.parametrize("kind", ["decode_qkv", "prefill_qkv"])
def test_interpreter_qkv_kernels_store_what_the_torch_path_stores(interpreter_results, kind):
    check_qkv(interpreter_results[kind], "float32")


def test_interpreter_attention_kernels_widen_the_fp8_cache(interpreter_results):
    errors = interpreter_results["attention"]
    assert errors["decode"] <= 1e-5 and errors["prefill"] <= 1e-5, errors
    # fp16 dots: q and the softmax weights rounded to fp16 (the cache's values are exact in fp16)
    assert 0 < errors["decode_fp16_dots"] <= 5e-3, errors


def test_an_fp8_cache_launches_its_own_tile():
    assert decode_attention.FP8_CONFIG.fp16_dots and not decode_attention.DEFAULT_CONFIG.fp16_dots


def test_interpreter_prefix_copies_move_fp8_bytes(interpreter_results):
    assert interpreter_results["block_copy"] is True


def test_a_write_clamps_and_rounds_to_nearest_once():
    # 480 and -1000 are past e4m3's 448 (a plain cast makes them NaN); 0.30078 (bf16's 0.3) lies
    # between the grid's 0.28125 and 0.3125; 17 halfway between 16 and 18 (to even: 16); 1e-4 is
    # under half the smallest subnormal step (2^-9)
    x = torch.tensor([1000.0, -1000.0, 448.0, 480.0, 0.3, -0.3, 1e-4, 17.0]).to(torch.bfloat16)
    stored = kv_format.to_cache(x, FP8)
    assert stored.dtype == FP8 and not stored.float().isnan().any()
    assert stored.float().tolist() == [448.0, -448.0, 448.0, 448.0, 0.3125, -0.3125, 0.0, 16.0]
    assert kv_format.to_cache(x, torch.bfloat16) is x  # the model's dtype: the exact cache
    assert kv_format.from_cache(stored, torch.bfloat16).dtype == torch.bfloat16


def test_an_fp8_cache_on_a_gpu_older_than_ada_is_refused_at_setup(monkeypatch):
    from moss_tts.engine import EngineConfigError

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100
    with pytest.raises(EngineConfigError, match="kv_cache_dtype='fp8_e4m3' needs a GPU"):
        EngineConfig(kv_cache_dtype="fp8_e4m3").check_model(cuda, torch.bfloat16, 40960)
    EngineConfig().check_model(cuda, torch.bfloat16, 40960)  # the exact cache runs anywhere
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100
    EngineConfig(kv_cache_dtype="fp8_e4m3").check_model(cuda, torch.bfloat16, 40960)


def test_cache_dtypes_and_their_sizes():
    assert kv_format.cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert kv_format.cache_dtype("fp8_e4m3", torch.bfloat16) == FP8
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_format.cache_dtype("fp8", torch.bfloat16)
    cache = StaticKVCache(4, 3, 64, 2, 16, prefix_blocks=2)
    assert cache.num_bytes(FP8) * 2 == cache.num_bytes(torch.bfloat16)


def test_the_cache_stores_the_rounded_values_on_every_write_path():
    cache = StaticKVCache(1, 4, 16, 2, 8)
    cache.setup(torch.device("cpu"), FP8)
    assert cache.dtype == FP8
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 5, 2, 8, generator=gen) * 500, torch.randn(2, 5, 2, 8, generator=gen)
    cache.write_prompts(0, torch.tensor([3, 1]), k, v)
    assert torch.equal(cache.k[0][[3, 1], :5].float(), kv_format.to_cache(k, FP8).float())
    step_k = torch.randn(2, 2, 8, generator=gen)
    cache.write_step(0, torch.tensor([0, 2]), torch.tensor([7, 0]), step_k, step_k)
    assert torch.equal(cache.v[0][2, 0].float(), kv_format.to_cache(step_k[1], FP8).float())
    keys, values = cache.write_range(0, 1, 5, k[:1, :3], v[:1, :3])  # returned widened, for attention
    assert keys.dtype == torch.float32 and keys.shape == (1, 8, 2, 8)
    assert torch.equal(keys[0, 5:], kv_format.to_cache(k[0, :3], FP8).float())
    window_k, _ = cache.window(0, 4, 16, torch.float32)
    assert window_k.dtype == torch.float32 and torch.equal(window_k[2, 0], cache.as_stored(step_k[1]))


def _hidden(model, kv_dtype: torch.dtype) -> torch.Tensor:
    """The tiny backbone's torch path: 3 prompts prefilled, then 4 decode steps each fed the
    prompt's next rows; the last hidden state of every step, [4, 3, H]."""
    b = model.cfg.backbone
    cache = StaticKVCache(b.num_hidden_layers, 3, 32, b.num_key_value_heads, b.head_dim)
    cache.setup(torch.device("cpu"), kv_dtype)
    gen = torch.Generator().manual_seed(3)
    embeds = torch.randn(3, 14, b.hidden_size, generator=gen)
    slots, f = torch.arange(3), Fusions.eager()
    out = []
    with torch.inference_mode():
        backbone.prefill(model.transformer, f, cache, embeds[:, :10], slots, torch.full((3,), 10))
        for t in range(10, 14):
            out.append(backbone.decode(model.transformer, f, cache, embeds[:, t:t + 1], slots,
                                       torch.full((3,), t), 32))
    return torch.stack(out)


def test_the_backbone_reads_back_the_fp8_cache(tiny_model):
    exact, rounded = _hidden(tiny_model, torch.float32), _hidden(tiny_model, FP8)
    error = relative_error(rounded, exact)
    assert 0.0 < error < 0.1, error  # it is read (the hidden states move), and it is close


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "int8"])  # int8: test_kv_int8.py's cache
def test_an_engine_on_a_byte_cache_serves_and_frees_its_slots(tiny_model, builder, kv_cache_dtype):
    prompts = [builder.build(PromptSpec(text)) for text in ("One two three.", "A longer sentence, to prefill.")]
    sink = Collector()
    engine = Engine(tiny_model, EngineConfig(max_running_requests=2, kv_cache_dtype=kv_cache_dtype), sink)
    engine.start()
    try:
        ids = ["a", "b"]
        for rid, prompt in zip(ids, prompts):
            engine.submit(EngineRequest(rid, prompt, SamplingParams(seed=5, max_frames=8, ignore_stop=True)))
        sink.wait_finished(ids, TIMEOUT_S)
    finally:
        engine.shutdown(TIMEOUT_S)
    assert [sink.final(rid).reason for rid in ids] == ["max_frames"] * 2
    assert all(sink.codes(rid).shape == (8, tiny_model.cfg.n_vq) for rid in ids)
    assert engine.stats().requests_finished == 2


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_gpu_qkv_kernels_store_what_the_torch_path_stores(kind):
    check_qkv(fp8_qkv_errors(kind, "cuda", real=True), "bfloat16")


@pytest.mark.gpu
def test_gpu_attention_kernels_widen_the_fp8_cache():
    errors = fp8_attention_errors("cuda", real=True)
    assert max(errors.values()) <= 2e-2, errors
