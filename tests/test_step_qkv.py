"""The decode step's per-layer q/k/v kernels (kernels/step_qkv.py) against their torch references:
on CPU through Triton's interpreter (small shapes, one subprocess, since TRITON_INTERPRET must be
set before triton is imported) — the kernels alone, then wired into backbone.decode and
frame.local_step of the tiny model — and on a GPU at the model's real sizes, captured too."""

from __future__ import annotations

import json

import pytest
import torch

from moss_tts.kernels import step_qkv
from moss_tts.model.local_transformer import interleaved_rope
from moss_tts.model.qwen3 import neox_rope
from triton_interpreter import interpreter_json, relative_error

INTERPRETER_TIMEOUT_S = 300
TOLERANCE = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 2e-2}
GARBAGE = 1e4  # cache rows the step must neither read (local) nor write (either)

# decode: (slots, heads, kv_heads, head_dim, dtype); local: (rows, heads, head_dim, pos, dtype)
DECODE_CASES = {
    "f32_g2_d16": (3, 4, 2, 16, "float32"),
    "f32_g4_d32_one_slot": (1, 8, 2, 32, "float32"),
    "f32_heads_not_pow2": (5, 6, 2, 16, "float32"),
    "f16_g4_d64": (4, 8, 2, 64, "float16"),
}
# prefill: (prompts, tokens per prompt, heads, kv_heads, head_dim, dtype)
PREFILL_CASES = {
    "f32_g2_d16": (3, 5, 4, 2, 16, "float32"),
    "f32_one_prompt": (1, 9, 8, 2, 32, "float32"),
    "f16_g4_d64": (4, 3, 8, 2, 64, "float16"),
    "f32_real_heads": (3, 7, 32, 8, 128, "float32"),  # the backbone's: 32 q heads, 8 kv heads of 128
}
LOCAL_CASES = {
    "f32_d16_pos0": (3, 4, 16, 0, "float32"),
    "f32_d16_pos5": (3, 4, 16, 5, "float32"),
    "f32_d80_pos12": (2, 4, 80, 12, "float32"),  # the real head_dim: 40 pairs in a 64-wide tile
    "f32_heads_10_pos3": (2, 10, 16, 3, "float32"),  # 2 programs of 8 heads, the second part empty
    "f16_d80_pos7": (2, 4, 80, 7, "float16"),
}


def decode_inputs(slots, heads, kv_heads, head_dim, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(slots, 1, (heads + 2 * kv_heads) * head_dim, generator=gen) * 2
    q_weight = 1 + 0.3 * torch.randn(head_dim, generator=gen)
    k_weight = 1 + 0.3 * torch.randn(head_dim, generator=gen)
    positions = torch.randint(0, 40, (slots,), generator=gen)
    cos, sin = neox_rope(positions[:, None], head_dim, 1e6, torch.float32)
    cache = torch.full((slots + 2, 48, kv_heads, head_dim), GARBAGE)
    cast = dict(device=device, dtype=getattr(torch, dtype))
    return (qkv.to(**cast), q_weight.to(**cast), k_weight.to(**cast), cos.to(**cast), sin.to(**cast),
            cache.to(**cast), cache.clone().to(**cast), positions.to(device))


def decode_errors(slots, heads, kv_heads, head_dim, dtype, device="cpu") -> dict[str, float]:
    """Relative errors of the kernel's q, k cache and v cache against the reference's."""
    qkv, qw, kw, cos, sin, k_cache, v_cache, positions = decode_inputs(slots, heads, kv_heads, head_dim, dtype, device)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = step_qkv.reference_decode_qkv(qkv, qw, kw, 1e-6, cos, sin, ref_k, ref_v, positions, heads, kv_heads)
    got = step_qkv.decode_qkv(qkv, qw, kw, 1e-6, cos, sin, k_cache, v_cache, positions, heads, kv_heads)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    untouched = ref_k == GARBAGE
    assert torch.equal(k_cache[untouched], ref_k[untouched]) and torch.equal(v_cache[untouched], ref_v[untouched])
    written = (torch.arange(slots, device=positions.device), positions)  # the rest is GARBAGE, compared above
    return {"q": relative_error(got, expected), "k": relative_error(k_cache[written], ref_k[written]),
            "v": relative_error(v_cache[written], ref_v[written])}


def prefill_inputs(prompts, tokens, heads, kv_heads, head_dim, dtype, device="cpu", seed=0):
    """Prompts in shuffled slots of a larger cache, each token at its own row (distinct within a slot)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(prompts, tokens, (heads + 2 * kv_heads) * head_dim, generator=gen) * 2
    q_weight = 1 + 0.3 * torch.randn(head_dim, generator=gen)
    k_weight = 1 + 0.3 * torch.randn(head_dim, generator=gen)
    slots = torch.randperm(prompts + 2, generator=gen)[:prompts]
    rows = torch.randint(0, 30, (prompts, 1), generator=gen) + torch.arange(tokens)
    cos, sin = neox_rope(rows, head_dim, 1e6, torch.float32)
    # Rows reach 29 + tokens: the GPU case of 300 tokens needs more than the small cases' 48 (an index
    # past the cache is an IndexError on CPU but a device-side assert on CUDA, poisoning the process).
    cache = torch.full((prompts + 2, max(48, 48 + tokens - 16), kv_heads, head_dim), GARBAGE)
    cast = dict(device=device, dtype=getattr(torch, dtype))
    return (qkv.to(**cast), q_weight.to(**cast), k_weight.to(**cast), cos.to(**cast), sin.to(**cast),
            cache.to(**cast), cache.clone().to(**cast), slots.to(device), rows.to(device))


def prefill_errors(prompts, tokens, heads, kv_heads, head_dim, dtype, device="cpu") -> dict[str, float]:
    """Relative errors of prefill_qkv's q, k cache and v cache against the reference's; every cache row
    it was not given keeps its garbage."""
    qkv, qw, kw, cos, sin, k_cache, v_cache, slots, rows = prefill_inputs(prompts, tokens, heads, kv_heads, head_dim,
                                                                          dtype, device)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = step_qkv.reference_prefill_qkv(qkv, qw, kw, 1e-6, cos, sin, ref_k, ref_v, slots, rows, heads, kv_heads)
    got = step_qkv.prefill_qkv(qkv, qw, kw, 1e-6, cos, sin, k_cache, v_cache, slots, rows, heads, kv_heads)
    assert got.shape == expected.shape == (prompts, tokens, heads, head_dim) and got.dtype == expected.dtype
    untouched = ref_k == GARBAGE
    assert torch.equal(k_cache[untouched], ref_k[untouched]) and torch.equal(v_cache[untouched], ref_v[untouched])
    written = (slots.unsqueeze(1).expand_as(rows), rows)
    return {"q": relative_error(got, expected), "k": relative_error(k_cache[written], ref_k[written]),
            "v": relative_error(v_cache[written], ref_v[written])}


def local_inputs(rows, heads, head_dim, pos, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, 1, 3 * heads * head_dim, generator=gen)
    cos, sin = interleaved_rope(torch.arange(13)[:, None], head_dim, 1e6, torch.float32)
    cache = torch.full((rows, 13, heads, head_dim), GARBAGE)
    cache[:, :pos] = torch.randn(rows, pos, heads, head_dim, generator=gen)
    values = cache.clone()
    values[:, :pos] = torch.randn(rows, pos, heads, head_dim, generator=gen)
    cast = dict(device=device, dtype=getattr(torch, dtype))
    return qkv.to(**cast), cos[pos:pos + 1].to(**cast), sin[pos:pos + 1].to(**cast), cache.to(**cast), values.to(**cast)


def local_errors(rows, heads, head_dim, pos, dtype, device="cpu") -> dict[str, float]:
    qkv, cos, sin, k_cache, v_cache = local_inputs(rows, heads, head_dim, pos, dtype, device)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = step_qkv.reference_local_attention_step(qkv, cos, sin, ref_k, ref_v, pos, heads)
    got = step_qkv.local_attention_step(qkv, cos, sin, k_cache, v_cache, pos, heads)
    assert got.shape == expected.shape == (rows, 1, heads * head_dim) and got.dtype == expected.dtype
    # positions past pos keep their garbage: nothing read them (the result would show it) or wrote them
    assert torch.equal(k_cache[:, pos + 1:], ref_k[:, pos + 1:]) and torch.equal(v_cache[:, pos + 1:], ref_v[:, pos + 1:])
    return {"out": relative_error(got, expected), "k": relative_error(k_cache[:, :pos + 1], ref_k[:, :pos + 1]),
            "v": relative_error(v_cache[:, :pos + 1], ref_v[:, :pos + 1])}


def wired_errors() -> dict[str, float]:
    """The tiny model (fp32): backbone.decode and frame.local_step with the kernels against without."""
    from moss_tts.engine import backbone, frame
    from moss_tts.engine.kv_cache import StaticKVCache
    from moss_tts.kernels.fused import Fusions
    from moss_tts.model.config import MossTTSConfig
    from moss_tts.model.loading import build_random_model
    from moss_tts.tools.make_tiny_checkpoint import tiny_model_config_dict

    cfg = MossTTSConfig.from_dict(tiny_model_config_dict(), "tiny")
    model = build_random_model(cfg, "cpu", torch.float32, seed=0, std=0.15)
    with torch.inference_mode():
        backbone.merge_projections(model.transformer)
        b = cfg.backbone
        gen = torch.Generator().manual_seed(1)
        embeds = torch.randn(4, 1, b.hidden_size, generator=gen)
        positions = torch.tensor([0, 7, 3, 20])
        results, caches = [], []
        for kernel in (False, True):
            cache = StaticKVCache(b.num_hidden_layers, 6, 32, b.num_key_value_heads, b.head_dim)
            cache.setup(torch.device("cpu"), torch.float32)
            for layer in range(b.num_hidden_layers):  # the earlier rows of every slot
                cache.k[layer].normal_(generator=torch.Generator().manual_seed(layer))
                cache.v[layer].normal_(generator=torch.Generator().manual_seed(100 + layer))
            results.append(backbone.decode(model.transformer, Fusions.eager(), cache, embeds, torch.arange(4),
                                           positions, 32, use_kernel=False, qkv_kernel=kernel))
            caches.append(cache)
        layers = range(b.num_hidden_layers)
        errors = {"decode_hidden": relative_error(results[1], results[0]),
                  "decode_cache": max(max(relative_error(caches[1].k[i], caches[0].k[i]),
                                          relative_error(caches[1].v[i], caches[0].v[i])) for i in layers)}
        local = model.local_transformer
        rope = frame.LocalRope(local, cfg.n_vq + 1, "cpu", torch.float32)
        hidden = []
        for kernel in (False, True):
            local_caches = local.new_caches(4, cfg.n_vq + 1, "cpu", torch.float32)
            x = embeds[:, 0]
            for pos in range(cfg.n_vq + 1):  # every position, each fed the last one's output
                x = frame.local_step(local, Fusions.eager(), x, local_caches, pos, rope, attention_kernel=kernel)
            hidden.append(x)
        errors["local_hidden"] = relative_error(hidden[1], hidden[0])
    return errors


def interpreter_main() -> None:
    """Run in a subprocess with TRITON_INTERPRET=1: prints {case: {part: relative error}} as JSON."""
    errors = {f"decode_{name}": decode_errors(*case) for name, case in DECODE_CASES.items()}
    errors.update({f"prefill_{name}": prefill_errors(*case) for name, case in PREFILL_CASES.items()})
    errors.update({f"local_{name}": local_errors(*case) for name, case in LOCAL_CASES.items()})
    errors["wired"] = wired_errors()
    print(json.dumps(errors))


@pytest.fixture(scope="module")
def interpreter_errors() -> dict[str, dict[str, float]]:
    return interpreter_json("test_step_qkv", INTERPRETER_TIMEOUT_S)


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_interpreter_decode_qkv_matches_reference(interpreter_errors, name):
    tolerance = TOLERANCE[DECODE_CASES[name][-1]]
    assert all(e <= tolerance for e in interpreter_errors[f"decode_{name}"].values()), interpreter_errors[f"decode_{name}"]


@pytest.mark.parametrize("name", list(PREFILL_CASES))
def test_interpreter_prefill_qkv_matches_reference(interpreter_errors, name):
    tolerance = TOLERANCE[PREFILL_CASES[name][-1]]
    errors = interpreter_errors[f"prefill_{name}"]
    assert all(e <= tolerance for e in errors.values()), errors


@pytest.mark.parametrize("name", list(LOCAL_CASES))
def test_interpreter_local_attention_matches_reference(interpreter_errors, name):
    tolerance = TOLERANCE[LOCAL_CASES[name][-1]]
    assert all(e <= tolerance for e in interpreter_errors[f"local_{name}"].values()), interpreter_errors[f"local_{name}"]


def test_interpreter_kernels_wired_into_the_step_match_the_torch_path(interpreter_errors):
    errors = interpreter_errors["wired"]
    assert set(errors) == {"decode_hidden", "decode_cache", "local_hidden"}
    assert all(e <= 1e-5 for e in errors.values()), errors


def test_cpu_runs_the_references():
    """Without the interpreter a CPU tensor takes the torch path: exactly the reference."""
    qkv, qw, kw, cos, sin, k_cache, v_cache, positions = decode_inputs(3, 4, 2, 16, "float32")
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    assert torch.equal(step_qkv.decode_qkv(qkv, qw, kw, 1e-6, cos, sin, k_cache, v_cache, positions, 4, 2),
                       step_qkv.reference_decode_qkv(qkv, qw, kw, 1e-6, cos, sin, ref_k, ref_v, positions, 4, 2))
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    qkv, cos, sin, k_cache, v_cache = local_inputs(2, 4, 16, 3, "float32")
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    assert torch.equal(step_qkv.local_attention_step(qkv, cos, sin, k_cache, v_cache, 3, 4),
                       step_qkv.reference_local_attention_step(qkv, cos, sin, ref_k, ref_v, 3, 4))


def test_decode_kernel_needs_power_of_two_halves():
    assert step_qkv.fits_decode(128) and step_qkv.fits_decode(16)
    assert not step_qkv.fits_decode(80) and not step_qkv.fits_decode(7)


def test_reference_decode_equals_the_backbone_path():
    """reference_decode_qkv is what backbone._layer + StaticKVCache.write_step did before the kernel."""
    from moss_tts.engine.kv_cache import StaticKVCache
    from moss_tts.kernels.fused import qk_norm_rope

    qkv, qw, kw, cos, sin, _, _, positions = decode_inputs(3, 4, 2, 16, "float32")
    cache = StaticKVCache(1, 5, 48, 2, 16)
    cache.setup(torch.device("cpu"), torch.float32)
    q, k, v = qkv.split([64, 32, 32], dim=-1)
    q, k = qk_norm_rope(q.reshape(3, 1, 4, 16), k.reshape(3, 1, 2, 16), qw, kw, 1e-6, cos, sin)
    cache.write_step(0, torch.arange(3), positions, k[:, 0], v.reshape(3, 1, 2, 16)[:, 0])
    k_cache, v_cache = torch.zeros_like(cache.k[0]), torch.zeros_like(cache.v[0])
    got = step_qkv.reference_decode_qkv(qkv, qw, kw, 1e-6, cos, sin, k_cache, v_cache, positions, 4, 2)
    assert torch.equal(got, q) and torch.equal(k_cache, cache.k[0]) and torch.equal(v_cache, cache.v[0])


# Real sizes on CUDA, bf16: backbone heads 32 / kv 8 / d 128 over 256 slots; local heads 32, d 80.
@pytest.mark.gpu
@pytest.mark.parametrize("slots", [1, 256])
def test_gpu_decode_qkv_matches_reference(slots):
    errors = decode_errors(slots, 32, 8, 128, "bfloat16", "cuda")
    assert all(e <= TOLERANCE["bfloat16"] for e in errors.values()), errors


GPU_PREFILL_SHAPES = [(1, 300), (128, 16)]


@pytest.mark.parametrize(("prompts", "tokens"), GPU_PREFILL_SHAPES)
def test_the_gpu_prefill_shapes_fit_their_cache_on_cpu(prompts, tokens):
    """The GPU case's inputs, small heads, through the CPU path: a row past the cache fails here as an
    IndexError instead of as a device-side assert that takes every later GPU test down with it."""
    assert prefill_errors(prompts, tokens, 4, 2, 16, "float32") == {"q": 0.0, "k": 0.0, "v": 0.0}


@pytest.mark.gpu
@pytest.mark.parametrize(("prompts", "tokens"), GPU_PREFILL_SHAPES)
def test_gpu_prefill_qkv_matches_reference(prompts, tokens):
    errors = prefill_errors(prompts, tokens, 32, 8, 128, "bfloat16", "cuda")
    assert all(e <= TOLERANCE["bfloat16"] for e in errors.values()), errors


@pytest.mark.gpu
@pytest.mark.parametrize("pos", [0, 1, 12])
def test_gpu_local_attention_matches_reference(pos):
    errors = local_errors(256, 32, 80, pos, "bfloat16", "cuda")
    assert all(e <= TOLERANCE["bfloat16"] for e in errors.values()), errors


@pytest.mark.gpu
def test_gpu_captured_kernels_follow_new_inputs():
    """Both kernels in one CUDA graph, replayed on new inputs: the results of the new inputs."""
    qkv, qw, kw, cos, sin, k_cache, v_cache, positions = decode_inputs(64, 32, 8, 128, "bfloat16", "cuda")
    lqkv, lcos, lsin, lk, lv = local_inputs(64, 32, 80, 6, "bfloat16", "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile outside the capture
        step_qkv.decode_qkv(qkv, qw, kw, 1e-6, cos, sin, k_cache, v_cache, positions, 32, 8)
        step_qkv.local_attention_step(lqkv, lcos, lsin, lk, lv, 6, 32)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            q = step_qkv.decode_qkv(qkv, qw, kw, 1e-6, cos, sin, k_cache, v_cache, positions, 32, 8)
            out = step_qkv.local_attention_step(lqkv, lcos, lsin, lk, lv, 6, 32)
        new = decode_inputs(64, 32, 8, 128, "bfloat16", "cuda", seed=1)
        new_local = local_inputs(64, 32, 80, 6, "bfloat16", "cuda", seed=1)
        for dst, src in zip((qkv, qw, kw, cos, sin, k_cache, v_cache, positions), new):
            dst.copy_(src)
        for dst, src in zip((lqkv, lcos, lsin, lk, lv), new_local):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
    finally:  # a graph left for the garbage collector could be reset during a later test's capture
        del graph
    ref_k, ref_v = new[5].clone(), new[6].clone()
    expected = step_qkv.reference_decode_qkv(*new[:3], 1e-6, *new[3:5], ref_k, ref_v, new[7], 32, 8)
    assert relative_error(q, expected) <= TOLERANCE["bfloat16"]
    written = (torch.arange(64, device="cuda"), positions)
    assert relative_error(k_cache[written], ref_k[written]) <= TOLERANCE["bfloat16"]
    assert torch.equal(v_cache[written], ref_v[written])
    expected_local = step_qkv.reference_local_attention_step(*new_local[:3], new_local[3].clone(),
                                                             new_local[4].clone(), 6, 32)
    assert relative_error(out, expected_local) <= TOLERANCE["bfloat16"]
