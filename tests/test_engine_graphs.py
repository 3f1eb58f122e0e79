"""The graph-ready engine pieces on the CPU: shape buckets, the engine's frame sampler and fused
pointwise chains against the model's own code, the memory budget, and the overlap of launching
step N+1 before reading step N."""

from __future__ import annotations

import pytest
import torch

from moss_tts.contract.sampling_params import ChannelParams, SamplingParams
from moss_tts.engine import Engine, EngineConfig, EngineConfigError, EngineRequest
from moss_tts.engine.buckets import Buckets
from moss_tts.engine.frame import LocalRope, sample_frame
from moss_tts.engine.memory import check_memory_budget
from moss_tts.engine.slot_state import SlotState, param_rows
from moss_tts.kernels import fused
from moss_tts.model.processor import PromptSpec
from moss_tts.model.qwen3 import RMSNorm, apply_neox_rope, neox_rope
from moss_tts.model.sampler import ChannelTensors, FrameSampling, sample

from engine_events import TIMEOUT_S, Collector


def mixed_params(n_rows: int) -> list[SamplingParams]:
    kinds = [SamplingParams(seed=1), SamplingParams.greedy(),
             SamplingParams(seed=3, audio=ChannelParams(1.0, 0.95, 50, 1.3)),
             SamplingParams(seed=4, audio=ChannelParams(0.7, 1.0, 0, 1.0), stop=ChannelParams(0.0, 1.0, 0))]
    return [kinds[i % len(kinds)] for i in range(n_rows)]


def test_buckets_pad_to_the_next_size_and_fall_back_beyond():
    b = Buckets.build(max_running=100, max_seq_len=1000, max_graph_batch=64, min_kv=256,
                      prefill_tokens=128, is_padded=True)
    assert b.batch[-1] == 64 and b.kv == (256, 512, 1000) and b.prefill_tokens == (32, 64, 96, 128)
    assert b.decode_shape(3, 200) == (4, 256)
    assert b.decode_shape(64, 513) == (64, 1000)
    assert b.decode_shape(65, 10) == (65, 256)  # past the largest graph: exact size, eager
    assert b.has_decode_graph(64, 1000) and not b.has_decode_graph(65, 256)
    assert b.prefill_len(1, 33) == 64 and b.prefill_len(3, 33) == 48
    cpu = Buckets.build(100, 1000, 64, 256, 128, is_padded=False)
    assert cpu.decode_shape(3, 200) == (3, 200) and cpu.prefill_len(1, 33) == 33
    assert not cpu.has_decode_graph(1, 200)
    # after a reused prefix: a graph per (rows left, key window), the window a KV bucket
    assert b.key_window(150) == 256 and b.key_window(600) == 1000 and cpu.key_window(150) == 150
    assert len(b.prefix_prefill_shapes) == 4 * 3 and (32, 1000) in b.prefix_prefill_shapes
    big = Buckets.build(16, 5120, 256, 256, 512, is_padded=True)
    assert max(t for t, _ in big.prefix_prefill_shapes) == 256  # longer remainders run eagerly
    # batched prefills: (prompts, rows) buckets, without a reused prefix or with the smallest window
    served = Buckets.build(256, 2048, 256, 256, 512, is_padded=True)
    assert served.batch_prefill_shape(128, 14, 256) == (128, 16)  # a wave after a shared instruction
    assert served.batch_prefill_shape(146, 14, 0) == (192, 16)
    assert served.batch_prefill_shape(3, 200, 0) == (4, 256)
    assert served.batch_prefill_shape(3, 20, 512) == (3, 32)  # no graph for that window: exact prompts
    assert served.batch_prefill_shape(40, 300, 0) == (40, 304)  # past the largest rows bucket
    assert all(n * t <= 8192 and w in (0, 256) and t <= (w or t) for n, t, w in served.batch_prefill_shapes)
    assert cpu.batch_prefill_shape(3, 33, 0) == (3, 33)


def test_engine_frame_sampler_equals_model_sample_frame(tiny_model):
    """Precomputed RoPE + the fused sampling chains = model.sample_frame, bit for bit."""
    m, rows = tiny_model, 8
    torch.manual_seed(0)
    hidden = torch.randn(rows, m.cfg.hidden_size)
    params = mixed_params(rows)
    rope = LocalRope(m.local_transformer, m.cfg.n_vq + 1, "cpu", m.dtype)
    for frame_index in (0, 5):
        step = torch.full((rows,), frame_index)
        ref_state = FrameSampling.build(params, m.cfg.n_vq, m.cfg.audio_vocab_size, "cpu")
        ref_state.seen[:, :, ::7] = True  # a history, so the repetition penalty bites
        state = FrameSampling(ref_state.stop, ref_state.audio, ref_state.seed, ref_state.seen.clone())
        with torch.inference_mode():
            expected = m.sample_frame(hidden, ref_state, step)
            got = sample_frame(m, fused.Fusions.eager(), rope, hidden, state, step)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_the_engines_eager_draw_equals_sample():
    torch.manual_seed(1)
    logits = torch.randn(6, 1024) * 3
    channel = ChannelTensors.build([ChannelParams(1.7, 0.8, 25), ChannelParams(0.0, 1.0, 0),
                                    ChannelParams(1.0, 0.3, 0), ChannelParams(5.0, 1.0, 1),
                                    ChannelParams(1.0, 1.0, 2000), ChannelParams(0.5, 0.99, 7)], "cpu")
    seed = torch.arange(6) * 977
    for c in (0, 4, 12):
        position = torch.arange(6) * 13 + c
        expected = sample(logits, channel, seed, position)
        eager = fused.Fusions.eager()
        scores, scaled, greedy = eager.temperature_scores(logits, channel.temperature)
        sorted_scores, sorted_ids = torch.sort(scaled, dim=-1, descending=True)
        got = eager.select_token(sorted_scores, sorted_ids, scores, greedy, channel.top_k, channel.top_p,
                                 seed, position)
        assert torch.equal(got, expected)


def test_fused_chains_equal_the_modules():
    torch.manual_seed(2)
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = torch.rand(64) + 0.5
    x = torch.randn(3, 5, 64)
    assert torch.equal(fused.rms_norm(x, norm.weight, 1e-6), norm(x))
    delta = torch.randn(3, 5, 64)
    s, normed = fused.add_rms_norm(x, delta, norm.weight, 1e-6)
    assert torch.equal(s, x + delta) and torch.equal(normed, norm(x + delta))
    q, k = torch.randn(3, 5, 4, 16), torch.randn(3, 5, 2, 16)
    qn, kn = RMSNorm(16, 1e-6), RMSNorm(16, 1e-6)
    cos, sin = neox_rope(torch.arange(15).view(3, 5), 16, 1e6, torch.float32)
    gq, gk = fused.qk_norm_rope(q, k, qn.weight, kn.weight, 1e-6, cos, sin)
    assert torch.equal(gq, apply_neox_rope(qn(q), cos, sin)) and torch.equal(gk, apply_neox_rope(kn(k), cos, sin))


def test_merged_and_reduced_forms_compute_the_same_as_the_modules():
    torch.manual_seed(3)
    gate_up = torch.randn(3, 2, 40)
    gate, up = gate_up.split(20, dim=-1)
    assert torch.equal(fused.silu_mul_merged(gate_up), fused.silu_mul(gate, up))
    for keys in (1, 7, 13):  # the local transformer's positions
        q, k, v = torch.randn(4, 1, 3, 8), torch.randn(4, keys, 3, 8), torch.randn(4, keys, 3, 8)
        torch.testing.assert_close(fused.local_attention_reduced(q, k, v), fused.local_attention(q, k, v),
                                   rtol=1e-5, atol=1e-6)


def test_compiled_fusions_cover_every_eager_function():
    """Construction only (torch.compile is lazy): the GPU set lines up field for field."""
    from dataclasses import fields

    eager, compiled = fused.Fusions.eager(), fused.Fusions.compiled()
    assert compiled.is_compiled and not eager.is_compiled
    for f in fields(fused.Fusions):
        if f.name != "is_compiled":
            assert callable(getattr(compiled, f.name)) and getattr(compiled, f.name) is not getattr(eager, f.name), f.name
    # the one field whose compiled form is a different function (same math)
    assert compiled.local_attention._torchdynamo_orig_callable is fused.local_attention_reduced


def test_the_triton_kernels_are_off_on_the_cpu_whatever_the_config(tiny_model):
    engine = Engine(tiny_model, EngineConfig(max_running_requests=1, attention_kernel=True,
                                             sampler_kernel=True), lambda event: None)
    engine._runner.setup()
    ctx = engine._runner.ctx
    assert (ctx.attention_kernel, ctx.sampler_kernel, ctx.qkv_kernel, ctx.local_kernel, ctx.prefill_kernel) == (False,) * 5


def test_merged_projections_are_views_of_one_matrix(tiny_model):
    from moss_tts.engine.backbone import merge_projections

    merged = merge_projections(tiny_model.transformer)
    assert merge_projections(tiny_model.transformer) is merged  # once per model
    attn, mlp = tiny_model.transformer.layers[0].self_attn, tiny_model.transformer.layers[0].mlp
    qkv = merged[0].qkv
    assert qkv.shape[0] == attn.q_proj.out_features + 2 * attn.k_proj.out_features
    assert attn.k_proj.weight.data_ptr() == qkv[attn.q_proj.out_features:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == merged[0].gate_up[mlp.gate_proj.out_features:].data_ptr()


def test_slot_state_assign_matches_frame_sampling_build():
    from moss_tts.model.config import MossTTSConfig, real_model_config_dict

    cfg = MossTTSConfig.from_dict(real_model_config_dict(), "real")
    state = SlotState.allocate(4, cfg, "cpu")
    params = mixed_params(2)
    rows = [param_rows(p) for p in params]
    floats = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    ints = torch.tensor([r[1] for r in rows], dtype=torch.long)
    state.sampling.seen[3] = True
    state.assign(torch.tensor([3, 1]), floats, ints)
    expected = FrameSampling.build(params, cfg.n_vq, cfg.audio_vocab_size, "cpu")
    got = state.gather(torch.tensor([3, 1]))
    for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
        assert torch.equal(getattr(got.audio, name), getattr(expected.audio, name)), name
        assert torch.equal(getattr(got.stop, name), getattr(expected.stop, name)), name
    assert torch.equal(got.seed, expected.seed) and not got.seen.any()


def test_memory_budget_names_the_numbers_and_the_remedy(tiny_model, monkeypatch):
    # This engine holds 8 GiB; 12 GiB more of the 40 are in use by other processes.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * 2**30, 40 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 8 * 2**30)
    config = EngineConfig(gpu_memory_utilization=0.9, reserved_memory_gib=12.0)
    check_memory_budget(config, tiny_model, 12 * 2**30, torch.device("cuda"))  # 36 - 12 - 8 - 4 = 12 GiB
    with pytest.raises(EngineConfigError, match="max_seq_len.*gpu_memory_utilization"):
        check_memory_budget(config, tiny_model, 13 * 2**30, torch.device("cuda"))


def test_the_memory_plan_does_not_depend_on_which_stage_loaded_first(tiny_model, monkeypatch, caplog):
    # The reserve stands for the colocated stages whether or not they hold their memory yet.
    config = EngineConfig(gpu_memory_utilization=0.9, reserved_memory_gib=12.0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 8 * 2**30)
    for free in (32, 20):  # vocoder not loaded yet / already holding its 12 GiB
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, f=free: (f * 2**30, 40 * 2**30))
        check_memory_budget(config, tiny_model, 12 * 2**30, torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * 2**30, 40 * 2**30))  # others: 22 GiB
    with caplog.at_level("WARNING"):
        check_memory_budget(config, tiny_model, 12 * 2**30, torch.device("cuda"))
    assert "raise it" in caplog.text


@pytest.mark.parametrize("field, value", [("gpu_memory_utilization", 0.0), ("cuda_graph_prefill_tokens", -1),
                                          ("cuda_graph_max_batch", 0), ("reserved_memory_gib", -1.0)])
def test_new_config_fields_are_validated(field, value):
    with pytest.raises(EngineConfigError, match=field):
        EngineConfig(**{field: value})


def test_step_n_plus_1_is_launched_before_step_n_is_read(tiny_model, builder):
    """The overlap: every launch after the first precedes the read of the step before it."""
    order: list[str] = []
    sink = Collector()
    engine = Engine(tiny_model, EngineConfig(max_running_requests=2), sink)
    runner = engine._runner
    real_run_step = runner.run_step

    class Traced:
        def __init__(self, out, n):
            self.out, self.n = out, n

        def __getattr__(self, name):
            return getattr(self.out, name)

        def wait(self):
            order.append(f"read {self.n}")
            return self.out.wait()

    def traced_run_step(plan):
        n = sum(1 for o in order if o.startswith("launch"))
        order.append(f"launch {n}")
        return Traced(real_run_step(plan), n)

    runner.run_step = traced_run_step
    prompt = builder.build(PromptSpec("Overlap."))
    engine.submit(EngineRequest("r", prompt, SamplingParams(seed=0, max_frames=6, ignore_stop=True)))
    engine.start()
    try:
        sink.wait_finished(["r"])
    finally:
        engine.shutdown(TIMEOUT_S)
    # 6 frames: prefill + decode in launch 0, then one per launch up to launch 4.
    assert order[:4] == ["launch 0", "launch 1", "read 0", "launch 2"], order
    assert order[-1] == "read 4" and "launch 5" not in order, order


@pytest.mark.parametrize("max_graph_batch", [8, 2])
def test_padded_shapes_give_the_reference_codes(tiny_model, builder, max_graph_batch):
    """The GPU shape policy on the CPU: slot ranges, KV windows and prompt rows padded to
    buckets (idle slots and padding rows computed and ignored), or exact past the largest."""
    from moss_tts.model.generation import generate

    specs = ["Hello there.", "A longer sentence, to speak slowly.", "Bye.", "Numbers: one, two."]
    prompts = [builder.build(PromptSpec(text)) for text in specs]
    params = [SamplingParams(seed=i, max_frames=6 + 3 * i, ignore_stop=True) for i in range(4)]
    params[1] = SamplingParams.greedy(max_frames=9, ignore_stop=True)
    reference = generate(tiny_model, prompts, params)
    sink = Collector()
    config = EngineConfig(max_running_requests=4, max_seq_len=128)
    engine = Engine(tiny_model, config, sink)
    runner = engine._runner
    runner.buckets = Buckets.build(4, 128, max_graph_batch, 32, 128, is_padded=True)
    shapes = []  # (prompts of the group, prompts it ran as)
    inputs = runner._inputs
    runner._inputs = lambda group, n, t: shapes.append((len(group), n)) or inputs(group, n, t)
    for i in range(3):  # admitted together: 3 prompts padded to the 4-prompt bucket
        engine.submit(EngineRequest(f"p{i}", prompts[i], params[i]))
    engine.start()
    try:
        engine.submit(EngineRequest("p3", prompts[3], params[3]))
        sink.wait_finished([f"p{i}" for i in range(4)])
    finally:
        engine.shutdown(TIMEOUT_S)
    for i, ref in enumerate(reference):
        assert torch.equal(sink.codes(f"p{i}"), ref.codes), f"p{i}"
    assert shapes[0] == (3, 4)  # the padding prompt went to the scratch slot and changed nothing


def test_config_from_triton_parameters():
    config = EngineConfig.from_parameters({"device": "auto", "max_running_requests": "8", "enforce_eager": "true",
                                           "gpu_memory_utilization": "0.5", "max_seq_len": "1024"})
    assert (config.max_running_requests, config.enforce_eager, config.gpu_memory_utilization,
            config.max_seq_len, config.device) == (8, True, 0.5, 1024, None)
    with pytest.raises(EngineConfigError, match="enforce_eager"):
        EngineConfig.from_parameters({"enforce_eager": "yes"})
    with pytest.raises(EngineConfigError, match="max_seq_len"):
        EngineConfig.from_parameters({"max_seq_len": "1e3"})
    # a text field: stripped, then checked against its choices
    assert EngineConfig.from_parameters({"kv_cache_dtype": " fp8_e4m3 "}).kv_cache_dtype == "fp8_e4m3"
    with pytest.raises(EngineConfigError, match="kv_cache_dtype"):
        EngineConfig.from_parameters({"kv_cache_dtype": "fp4"})


def test_prompt_longer_than_a_prefill_chunk_is_prefilled_in_chunks(tiny_model):
    from moss_tts.model.generation import generate

    prompt = torch.full((70, 13), 1024, dtype=torch.long)
    prompt[:, 0] = torch.randint(0, 150000, (70,), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(seed=3, max_frames=8, ignore_stop=True)
    reference = generate(tiny_model, [prompt], [params])[0]
    sink = Collector()
    engine = Engine(tiny_model, EngineConfig(max_running_requests=2, prefill_chunk_tokens=32), sink)
    engine.submit(EngineRequest("long", prompt, params))
    engine.start()
    try:
        sink.wait_finished(["long"])
    finally:
        engine.shutdown(TIMEOUT_S)
    assert torch.equal(sink.codes("long"), reference.codes)
