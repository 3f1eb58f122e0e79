"""MOSS-Audio-Tokenizer-v2 codec: config, real-name loading, encode/decode shapes, streaming.

Everything runs on CPU in fp32 with the tiny config (same 12+12 stage topology, 48 kHz stereo
interleave, 3840 samples per frame and 32x1024x8 quantizer as the real codec).
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode

from moss_tts.codec import (CodecConfig, CodecConfigError, MossAudioCodec, build_real_size_codec, load_codec,
                            real_codec_config_dict, tiny_codec_config_dict, write_codec_checkpoint)
from moss_tts.codec.patch import Patch, deinterleave, interleave
from moss_tts.codec.transformer import DEFAULT_FUSION, FUSIONS, LT_GELU_FUSIONS, RING_KERNELS
from moss_tts.kernels.window_attention import apply_rope, local_causal_attention
from moss_tts.model.checkpoint import CheckpointError

SPF = 3840


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_codec_checkpoint(tmp_path_factory.mktemp("codec"), tiny_codec_config_dict(), seed=0)


@pytest.fixture(scope="module")
def codec(ckpt) -> MossAudioCodec:
    return load_codec(ckpt)


@pytest.fixture(scope="module")
def codes50(codec):
    torch.manual_seed(1)
    audio = 0.3 * torch.randn(2, 2, 50 * SPF)
    return codec.encode(audio, n_quantizers=12)[0]


def assert_close_to_peak(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-6) -> None:
    assert actual.shape == expected.shape
    err = (actual - expected).abs().max().item()
    peak = expected.abs().max().item()
    assert peak > 1e-3, "reference audio is trivial"
    assert err <= rel * peak, f"max abs diff {err:.3e} > {rel} x peak {peak:.3e}"


# ------------------------------------------------------------------ config and loading
def test_properties_and_windows(codec):
    assert (codec.sample_rate, codec.channels, codec.samples_per_frame, codec.frame_rate) == (48000, 2, 3840, 12.5)
    real = CodecConfig.from_dict(real_codec_config_dict(), "real")
    windows = lambda stages: [s.context for s in stages if hasattr(s, "context")]  # noqa: E731
    assert windows(real.decoder) == [125, 250, 400, 400, 400, 400]
    assert windows(real.encoder) == [400, 400, 400, 400, 250, 125]
    assert windows(codec.config.decoder) == [4, 8, 16, 24, 40, 64]


@pytest.mark.parametrize("key, value, field", [
    ("model_type", "moss_tts_local", "model_type"),
    ("quantizer_type", "rvq", "quantizer_type"),
    ("number_channels", 1, "number_channels"),
    ("enable_channel_interleave", False, "enable_channel_interleave"),
    ("downsample_rate", 1920, "encoder_kwargs"),
])
def test_config_errors_name_field_and_source(key, value, field):
    d = tiny_codec_config_dict()
    d[key] = value
    if key == "quantizer_type":
        d["quantizer_kwargs"]["quantizer_type"] = value
    with pytest.raises(CodecConfigError, match=f"my/config.json: {field}"):
        CodecConfig.from_dict(d, "my/config.json")


def test_real_names_load(ckpt, codec):
    on_disk = load_file(str(ckpt / "model.safetensors"))
    assert set(on_disk) == set(codec.state_dict())
    for name in ("quantizer.input_proj.parametrizations.weight.original0",
                 "quantizer.quantizers.31.out_proj.parametrizations.weight.original1",
                 "quantizer.quantizers.0.in_proj.bias", "quantizer.quantizers.5.codebook.weight",
                 "encoder.1.input_proj.weight", "encoder.11.output_proj.weight",
                 "decoder.0.transformer.layers.0.self_attn.in_proj.weight",
                 "decoder.10.transformer.layers.0.ffn.2.weight",
                 "encoder.3.transformer.layers.0.layer_scale_2.scale",
                 "decoder.4.transformer.layers.0.norm1.bias"):
        assert name in on_disk, name
    assert on_disk["quantizer.quantizers.3.in_proj.parametrizations.weight.original0"].shape == (8, 1, 1)
    assert on_disk["quantizer.quantizers.3.codebook.weight"].shape == (1024, 8)
    for name, tensor in codec.state_dict().items():
        assert torch.equal(tensor, on_disk[name]), name


@pytest.mark.parametrize("mutation", ["missing", "misshaped"])
def test_bad_checkpoint_names_tensor(ckpt, tmp_path, mutation):
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    name = "decoder.2.transformer.layers.0.self_attn.out_proj.weight"
    if mutation == "missing":
        del tensors[name]
    else:
        tensors[name] = torch.zeros(3, 5)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        load_codec(bad)


def test_real_size_param_counts_on_meta():
    model = build_real_size_codec("meta")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # Independent arithmetic from the published stage table (spec 3.2-3.4).
    def stage(i, o, d=768, ff=3072, layers=12):
        return i * d + d * o + layers * (4 * d * d + 2 * d * ff + 6 * d)
    big = dict(d=1280, ff=5120, layers=32)
    enc = stage(240, 384) + 3 * stage(768, 384) + stage(768, 640) + stage(1280, 768, **big)
    dec = stage(768, 1280, **big) + stage(640, 768) + 3 * stage(384, 768) + stage(384, 240)
    wn = lambda i, o: o * i + 2 * o  # noqa: E731  (v, g, bias)
    quant = wn(768, 512) + wn(512, 768) + 32 * (wn(512, 8) + wn(8, 512) + 1024 * 8)
    assert (count(model.encoder), count(model.decoder), count(model.quantizer)) == (enc, dec, quant)
    assert count(model) == 2_123_701_248 == enc + dec + quant  # total_parameters of the published index
    assert len(model.state_dict()) == 2094
    assert abs(enc / 1.061e9 - 1) < 0.01 and abs(dec / 1.061e9 - 1) < 0.01
    assert abs(count(model) / 2.12e9 - 1) < 0.01 and abs(quant / 1.3e6 - 1) < 0.05


def test_bf16_load_keeps_quantizer_fp32(ckpt, codes50):
    codec = load_codec(ckpt, dtype=torch.bfloat16)
    assert codec.decoder[0].input_proj.weight.dtype == torch.bfloat16
    assert codec.quantizer.quantizers[0].codebook.weight.dtype == torch.float32
    assert torch.isfinite(codec.decode(codes50[:, :3]).float()).all()


# ------------------------------------------------------------------ building blocks
def test_patch_matches_upstream_channel_first_reshape():
    x = torch.randn(2, 3, 5 * 4)  # upstream layout [B, D, L*h]
    up = x.reshape(2, 3, 5, 4).permute(0, 1, 3, 2).reshape(2, 12, 5)
    ours = Patch(4, True)(x.transpose(1, 2))
    assert torch.equal(ours, up.transpose(1, 2))
    assert torch.equal(Patch(4, False)(ours), x.transpose(1, 2))
    audio = torch.randn(2, 2, 7)
    assert torch.equal(interleave(audio)[0, :4, 0], torch.stack([audio[0, 0, 0], audio[0, 1, 0],
                                                                 audio[0, 0, 1], audio[0, 1, 1]]))
    assert torch.equal(deinterleave(interleave(audio), 2), audio)


def test_rope_scores_depend_on_relative_position_only():
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    score = lambda pq, pk: (apply_rope(q, torch.tensor([[pq]]), 1e4) * apply_rope(k, torch.tensor([[pk]]), 1e4)).sum()  # noqa
    assert torch.allclose(score(7, 3), score(107, 103), atol=1e-5)
    assert torch.equal(apply_rope(q, torch.tensor([[0]]), 1e4), q)


@pytest.mark.parametrize("t, window", [(5, 8), (17, 4), (64, 16), (33, 7)])
def test_block_attention_equals_dense_window_mask(t, window):
    q, k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(t)
    delta = pos[:, None] - pos[None, :]
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=(delta >= 0) & (delta < window))
    assert torch.allclose(local_causal_attention(q, k, v, window), dense, atol=1e-12)


# ------------------------------------------------------------------ encode / decode
@pytest.mark.parametrize("samples", [1, SPF - 1, SPF, SPF + 1, 3 * SPF - 5])
def test_encode_lengths(codec, samples):
    codes, lengths = codec.encode(0.1 * torch.randn(2, 2, samples), torch.tensor([samples, 1]))
    frames = math.ceil(samples / SPF)
    assert codes.shape == (2, frames, 12) and codes.dtype == torch.long
    assert lengths.tolist() == [samples // SPF, 0]  # whole frames only, as upstream
    assert 0 <= codes.min() and codes.max() < 1024


def test_encode_quantizer_counts(codec):
    audio = 0.3 * torch.randn(1, 2, 4 * SPF)
    c32, _ = codec.encode(audio, n_quantizers=32)
    c1, _ = codec.encode(audio, n_quantizers=1)
    assert c32.shape == (1, 4, 32)
    assert torch.equal(c32[..., :1], c1) and torch.equal(c32[..., :12], codec.encode(audio)[0])
    for bad in (0, 33):
        with pytest.raises(ValueError, match="n_quantizers"):
            codec.encode(audio, n_quantizers=bad)
    with pytest.raises(ValueError, match="shape"):
        codec.encode(torch.randn(1, 1, SPF))


@pytest.mark.parametrize("n_q", [1, 12, 32])
def test_decode_lengths(codec, n_q):
    codes = torch.randint(0, 1024, (3, 4, n_q))
    audio = codec.decode(codes)
    assert audio.shape == (3, 2, 4 * SPF) and torch.isfinite(audio).all()
    assert audio.abs().max() > 1e-3 and not torch.equal(audio[:, 0], audio[:, 1])


def test_decode_rejects_bad_codes(codec):
    with pytest.raises(ValueError, match="n_quantizers"):
        codec.decode(torch.zeros(1, 2, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 1024\)"):
        codec.decode(torch.full((1, 2, 12), 1024))


# ------------------------------------------------------------------ streaming
@pytest.mark.parametrize("chunks", [[1] * 50, [5] * 10, [25] * 2, [1, 3, 7, 2, 5, 25, 7]],
                         ids=["1", "5", "25", "mixed"])
def test_streaming_equals_offline(codec, codes50, chunks):
    offline = codec.decode(codes50)
    state = codec.new_decode_state(2)
    assert [c.shape[-2] for c in state.caches] == [4, 8, 16, 24, 40, 64]  # all shorter than 50 frames
    out, start = [], 0
    for n in chunks:
        out.append(codec.decode_step(codes50[:, start:start + n], state))
        start += n
    assert start == 50 and state.frames.tolist() == [50, 50]
    assert_close_to_peak(torch.cat(out, dim=-1), offline)


def _run_schedule(codec, streams, schedule, chunk=3, num_slots=4, slots=(3, 1)):
    """Feed each stream chunk by chunk into one state of `num_slots` rows, stream i in slot
    slots[i]; schedule lists which streams have a chunk in each step (only those rows decode)."""
    state = codec.new_decode_state(num_slots)
    cursors, outs = [0] * len(streams), [[] for _ in streams]
    for mask in schedule:
        active = [i for i, on in enumerate(mask) if on]
        batch = torch.stack([streams[i][cursors[i]:cursors[i] + chunk] for i in active])
        audio = codec.decode_step(batch, state, torch.tensor([slots[i] for i in active]))
        for row, i in enumerate(active):
            outs[i].append(audio[row])
            cursors[i] += chunk
    return state, [torch.cat(o, dim=-1) for o in outs]


def test_batched_streams_decode_only_their_rows(codec, codes50):
    a, b = codes50[0, :36], codes50[1, :36]
    schedule = [(1, 0), (1, 0), (1, 1), (0, 1), (1, 1), (0, 1), (0, 1), (1, 1), (1, 0)] + [(1, 1)] * 6
    state, (out_a, out_b) = _run_schedule(codec, [a, b], schedule)
    assert state.frames.tolist() == [0, 36, 0, 36]
    assert all(not c[:, [0, 2]].any() for c in state.caches)  # rows never decoded: still zero
    assert_close_to_peak(out_a, codec.decode(a[None])[0])
    assert_close_to_peak(out_b, codec.decode(b[None])[0])


def test_decode_step_rows_must_match_codes(codec, codes50):
    state = codec.new_decode_state(3)
    with pytest.raises(ValueError, match="pass rows"):
        codec.decode_step(codes50[:, :2], state)
    with pytest.raises(ValueError, match=r"rows must have shape \[2\]"):
        codec.decode_step(codes50[:, :2], state, torch.tensor([0]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 4, 2), (1, 3, 1)])  # rows of whole 8-byte words, and rows of 6 or 12 bytes
def test_reset_rows_zeroes_exactly_the_rows_listed(dtype, shape):
    from moss_tts.codec.streaming import CodecDecodeState

    state = CodecDecodeState.empty(5, [shape, shape], torch.device("cpu"), dtype)
    g = torch.Generator().manual_seed(3)
    for cache in state.caches:
        cache.copy_(torch.randn(cache.shape, generator=g).to(dtype) + 2)  # no zero anywhere
    state.frames.fill_(7)
    kept = [c.clone() for c in state.caches]
    state.reset_rows([3, 1])
    assert state.frames.tolist() == [7, 0, 7, 0, 7]
    for cache, before in zip(state.caches, kept):
        assert cache.dtype == dtype and cache.shape == before.shape
        assert not cache[:, [1, 3]].any()
        assert torch.equal(cache[:, [0, 2, 4]], before[:, [0, 2, 4]])


def test_reset_rows_of_caches_that_are_no_whole_words():
    from moss_tts.codec.streaming import CodecDecodeState

    base = torch.arange(1, 2 * 3 * 8 + 2, dtype=torch.bfloat16)
    odd_offset = base[1:].view(2, 3, 1, 4, 2)  # storage offset of 2 bytes: no int64 view of it
    strided = torch.arange(1, 2 * 3 * 16 + 1, dtype=torch.float32).view(2, 3, 1, 4, 4)[..., ::2]
    state = CodecDecodeState(torch.zeros(3, dtype=torch.long), [odd_offset, strided, torch.zeros(2, 3, 0, 4, 2)])
    kept = [c.clone() for c in state.caches]
    state.reset_rows([1])
    for cache, before in zip(state.caches, kept):
        assert not cache[:, 1].any()
        assert torch.equal(cache[:, [0, 2]], before[:, [0, 2]])


def test_reset_slot_then_reuse(codec, codes50):
    a, b, c = codes50[0, :24], codes50[1, :30], codes50[0, 24:48]
    state = codec.new_decode_state(2)
    first_b = [codec.decode_step(torch.stack([a[i:i + 6], b[i:i + 6]]), state)[1] for i in range(0, 18, 6)]
    kept = [c[:, 1].clone() for c in state.caches]
    state.reset_rows([0])
    assert state.frames.tolist() == [0, 18]
    assert all(not c[:, 0].any() for c in state.caches)  # the reset row is zeroed ...
    assert all(torch.equal(c[:, 1], k) for c, k in zip(state.caches, kept))  # ... and only that row
    out_c, rest_b = [], []
    for i in range(0, 12, 6):
        audio = codec.decode_step(torch.stack([c[i:i + 6], b[18 + i:24 + i]]), state)
        out_c.append(audio[0])
        rest_b.append(audio[1])
    assert_close_to_peak(torch.cat(out_c, -1), codec.decode(c[None, :12])[0])
    assert_close_to_peak(torch.cat(first_b + rest_b, -1), codec.decode(b[None])[0])


def test_each_model_loads_only_the_half_it_needs(ckpt, codec, codes50):
    """ref_encoder: encoder + quantizer; vocoder: quantizer + decoder. Each half computes exactly
    what the whole codec computes, and the missing half says so instead of failing obscurely."""
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    encoder_only = load_codec(ckpt, parts=("encoder", "quantizer"))
    decoder_only = load_codec(ckpt, parts=("quantizer", "decoder"))
    assert count(encoder_only) + count(decoder_only) == count(codec) + count(codec.quantizer)
    torch.manual_seed(3)
    audio = 0.3 * torch.randn(1, 2, 7 * SPF)
    assert torch.equal(encoder_only.encode(audio)[0], codec.encode(audio)[0])
    assert torch.equal(decoder_only.decode(codes50[:1]), codec.decode(codes50[:1]))
    with pytest.raises(RuntimeError, match="loaded without that half"):
        encoder_only.decode(codes50[:1])
    with pytest.raises(RuntimeError, match="loaded without that half"):
        decoder_only.encode(audio)
    with pytest.raises(ValueError, match="must include 'quantizer'"):
        load_codec(ckpt, parts=("encoder",))


def test_serving_form_computes_the_same_function(ckpt, codes50):
    """The serving form (LayerScale in the branch weights with the residual add inside the GEMM,
    weight norm computed once) rounds differently, nothing more: offline and streamed audio
    agree with the loaded form."""
    loaded, served = load_codec(ckpt), load_codec(ckpt).serving_form_()
    served.serving_form_()  # idempotent: a second fold must not scale twice
    assert all(layer.scale_folded for layer in served.modules() if hasattr(layer, "scale_folded"))
    assert not any(name.endswith(("original0", "original1")) for name in served.state_dict())
    expected = loaded.decode(codes50)
    assert_close_to_peak(served.decode(codes50), expected, rel=1e-5)
    state = served.new_decode_state(2)
    streamed = torch.cat([served.decode_step(codes50[:, i:i + 10], state) for i in range(0, 50, 10)], dim=-1)
    assert_close_to_peak(streamed, expected, rel=1e-5)


def _packing(lengths: list[int], max_frames: int, pad_frames: int = 0, device: str = "cpu"):
    """Packing of rows with `lengths` frames, back to back, then `pad_frames` frames no row owns."""
    from moss_tts.codec.streaming import Packing
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    frame_rows = [i for i, n in enumerate(lengths) for _ in range(n)] + [0] * pad_frames
    frame_steps = [s for n in lengths for s in range(n)] + [0] * pad_frames
    return Packing(*(torch.tensor(x, device=device) for x in (starts, lengths, frame_rows, frame_steps)), max_frames)


@pytest.mark.parametrize("schedule", [
    # per step: (stream, frames) of the rows it decodes; stream -1 is a padding row (0 frames)
    [[(0, 2), (1, 10), (2, 4)], [(2, 10), (0, 8), (1, 3)], [(1, 10), (0, 10), (-1, 0)], [(0, 10), (2, 1)]],
    [[(0, 1), (1, 1), (2, 1)], [(0, 7), (2, 9)], [(1, 9), (0, 10), (2, 10)], [(1, 10), (-1, 0), (-1, 0)]],
], ids=["mixed", "ragged"])
@pytest.mark.parametrize("pad_frames", [0, 5])
def test_packed_steps_equal_each_stream_offline(codec, codes50, schedule, pad_frames):
    """Rows of different frame counts in one packed step each decode exactly their own stream:
    padding rows (length 0, on a spare row) and padding frames change nothing."""
    streams = [codes50[0], codes50[1], codes50[0, 7:]]
    slots, spare = [3, 0, 2], 1
    state = codec.new_decode_state(4)
    cursors, outs = [0, 0, 0], [[], [], []]
    for step in schedule:
        rows = [slots[s] if s >= 0 else spare for s, _ in step]
        lengths = [n for _, n in step]
        codes = torch.cat([streams[s][cursors[s]:cursors[s] + n] for s, n in step if s >= 0]
                          + [torch.zeros(pad_frames, 12, dtype=torch.long)])
        audio = codec.decode_step_packed(codes, state, torch.tensor(rows), _packing(lengths, 10, pad_frames))
        assert audio.shape == (2, codes.shape[0] * SPF)
        start = 0
        for s, n in step:
            if s >= 0:
                outs[s].append(audio[:, start * SPF:(start + n) * SPF])
                cursors[s] += n
            start += n
        assert state.frames[spare] == 0 and all(not c[:, spare].any() for c in state.caches)
    for s, stream in enumerate(streams):
        assert state.frames[slots[s]] == cursors[s]
        assert_close_to_peak(torch.cat(outs[s], -1), codec.decode(stream[None, :cursors[s]])[0])


class OpCounter(TorchDispatchMode):
    """The aten ops run inside it (on the CPU, each would be a kernel on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("n_q", [1, 12, 32])
def test_served_quantizer_decodes_from_one_table_the_same_function(ckpt, n_q):
    """ResidualLFQ.freeze_decode_table_: every codebook's entries through both projections once,
    in float64; a decode is then a gather and a sum (4 aten ops, whatever n_q) instead of ~50, and
    gives the loaded form's output up to fp32 rounding order. The table is no checkpoint tensor."""
    loaded, served = (load_codec(ckpt).quantizer, load_codec(ckpt).serving_form_().quantizer)
    assert served.decode_table is not None and not any("decode_" in name for name in served.state_dict())
    table = served.decode_table
    served.freeze_decode_table_()  # idempotent
    assert served.decode_table is table and table.shape == (32 * 1024, 16) and table.dtype == torch.float32
    codes = torch.randint(0, 1024, (3, 7, n_q), generator=torch.Generator().manual_seed(n_q))
    codes[0, 0] = 1023  # each codebook's last entry: the table rows just before the next codebook's
    with OpCounter() as counter:
        got = served.decode(codes)
    assert len(counter.ops) <= 4, counter.ops
    assert_close_to_peak(got, loaded.decode(codes), rel=1e-6)


@pytest.mark.gpu
def test_served_quantizer_table_on_a_gpu_decodes_the_same_function_in_a_graph(ckpt):
    """On CUDA, and captured: the table's decode (a gather and a sum) replays like its eager
    self and gives the loaded form's output up to fp32 rounding order."""
    loaded, served = (load_codec(ckpt, "cuda").quantizer, load_codec(ckpt, "cuda").serving_form_().quantizer)
    codes = torch.randint(0, 1024, (4, 10, 12), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    expected = loaded.decode(codes)
    static = codes.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        served.decode(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = served.decode(static)
    graph.replay()
    assert torch.equal(out, served.decode(codes))
    assert_close_to_peak(out, expected, rel=1e-6)


def test_packed_step_refuses_codes_that_do_not_match_the_packing(codec, codes50):
    state = codec.new_decode_state(3)
    with pytest.raises(ValueError, match="packing covers 5 frames"):
        codec.decode_step_packed(codes50[0, :4], state, torch.tensor([0, 1]), _packing([2, 3], 10))
    with pytest.raises(ValueError, match=r"integer tensor \[N, n_q\]"):
        codec.decode_step_packed(codes50[:, :4], state, torch.tensor([0, 1]), _packing([2, 2], 10))


@pytest.mark.parametrize("fusion", [f for f in FUSIONS if f != "none"])
def test_fusion_is_checked_and_changes_nothing_where_its_kernel_cannot_run(ckpt, fusion):
    with pytest.raises(ValueError, match="fusion must be one of"):
        load_codec(ckpt).serving_form_(fusion="all")
    served = load_codec(ckpt).serving_form_(fusion)  # CPU: the kernels cannot run, the layers stay as they are
    assert {m.fusion for m in served.modules() if hasattr(m, "fusion")} == {"none"}


def ring_kernel_audio(codec, codes50, device: str = "cpu") -> torch.Tensor:
    """Two streams through batched steps (2, 10, 1 and 7 frames), then a packed step of both
    plus a padding row and 3 padding frames (the graphs' step), then one more batched step:
    every step's audio, concatenated."""
    codes, state, out = codes50.to(device), codec.new_decode_state(3, device), []
    rows = torch.tensor([2, 0], device=device)
    start = 0
    for size in (2, 10, 1, 7):
        out.append(codec.decode_step(codes[:, start:start + size], state, rows).flatten())
        start += size
    packed = torch.cat([codes[0, start:start + 4], codes[1, start:start + 9], torch.zeros_like(codes[0, :3])])
    audio = codec.decode_step_packed(packed, state, torch.tensor([2, 1, 0], device=device),
                                     _packing([4, 0, 9], 10, 3, device))
    out.append(audio[:, :13 * SPF].flatten())  # the padding frames' audio is whatever memory held
    out.append(codec.decode_step(codes[:, 30:40], state, rows).flatten())  # rows at 24 and 29 frames
    return torch.cat(out)


def test_ring_kernel_is_checked_and_changes_nothing_where_no_kernel_runs(ckpt, codes50):
    with pytest.raises(ValueError, match="ring_kernel must be one of"):
        load_codec(ckpt).serving_form_(ring_kernel="both")
    split, fused = (load_codec(ckpt).serving_form_(ring_kernel=kernel) for kernel in RING_KERNELS)
    # CPU: the torch reference runs either way, so the layers keep the default
    assert {m.ring_kernel for m in fused.modules() if hasattr(m, "ring_kernel")} == {"split"}
    assert torch.equal(ring_kernel_audio(split, codes50), ring_kernel_audio(fused, codes50))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_ring_kernel_streams_bit_for_bit_like_the_split_kernels_on_a_gpu(ckpt, codes50, dtype):
    split, fused = (load_codec(ckpt, "cuda", dtype).serving_form_(DEFAULT_FUSION, kernel) for kernel in RING_KERNELS)
    assert {m.ring_kernel for m in fused.modules() if hasattr(m, "ring_kernel")} == {"fused"}
    expected = ring_kernel_audio(split, codes50, "cuda")
    assert torch.isfinite(expected).all() and torch.equal(ring_kernel_audio(fused, codes50, "cuda"), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("fusion", [f for f in FUSIONS if f != "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_serving_form_on_a_gpu_runs_the_norms_and_gelu_as_asked(ckpt, codes50, dtype, fusion):
    """On a GPU the serving form runs every LayerNorm and GELU as `fusion` says: offline and
    streamed audio still agree with the loaded form (fp32: within rounding; bf16: within the
    bf16 tolerance of the codec's other GPU checks). The fusions with cuBLASLt's epilogue compute
    the tanh GELU, so the loaded form they are held to uses that GELU too; what it does to the
    audio against the exact GELU is bench_vocoder --fidelity's."""
    rel = 1e-4 if dtype == torch.float32 else 0.03
    loaded = load_codec(ckpt, "cuda", dtype)
    if fusion in LT_GELU_FUSIONS:
        for layer in (m for m in loaded.modules() if hasattr(m, "fusion")):
            layer.ffn[1] = torch.nn.GELU(approximate="tanh")
    served = load_codec(ckpt, "cuda", dtype).serving_form_(fusion)
    served.serving_form_(fusion)  # idempotent: the weights are repacked once
    layers = [m for m in served.modules() if hasattr(m, "fusion")]
    assert layers and all(layer.fusion == fusion for layer in layers)
    codes = codes50.cuda()
    expected = loaded.decode(codes).float()
    assert_close_to_peak(served.decode(codes).float(), expected, rel=rel)
    state = served.new_decode_state(2)
    streamed = torch.cat([served.decode_step(codes[:, i:i + 10], state) for i in range(0, 50, 10)], dim=-1)
    assert_close_to_peak(streamed.float(), expected, rel=rel)
