"""Configuration of MOSS-Audio-Tokenizer-v2, parsed once from the checkpoint's config.json.

The published config lists encoder and decoder modules in execution order
(`encoder_kwargs`, `decoder_kwargs`): `PatchedPretransform` (pure reshape) and `Transformer`
(ProjectedTransformer) entries. Everything the modules need is resolved here, including the
attention window of every stage in keys, so nothing downstream re-reads the raw dict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Union

from ..model.config import read_config_json

MODEL_TYPE = "moss-audio-tokenizer"


class CodecConfigError(ValueError):
    """config.json does not describe a codec this package can run."""


@dataclass(frozen=True)
class PatchStage:
    patch_size: int


@dataclass(frozen=True)
class TransformerStage:
    input_dimension: int
    output_dimension: int
    d_model: int
    num_heads: int
    num_layers: int
    dim_feedforward: int
    context: int  # sliding attention window in keys (query itself included)
    max_period: float
    layer_scale: float

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


Stage = Union[PatchStage, TransformerStage]


@dataclass(frozen=True)
class QuantizerConfig:
    input_dim: int
    rvq_dim: int
    output_dim: int
    num_quantizers: int
    codebook_size: int
    codebook_dim: int


@dataclass(frozen=True)
class CodecConfig:
    sampling_rate: int
    downsample_rate: int  # samples per frame per channel
    number_channels: int
    encoder: tuple[Stage, ...]
    decoder: tuple[Stage, ...]
    quantizer: QuantizerConfig
    source: str

    @property
    def frame_rate(self) -> float:
        return self.sampling_rate / self.downsample_rate

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "CodecConfig":
        return cls.from_dict(*read_config_json(directory, CodecConfigError, "codec config.json not found"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> "CodecConfig":
        return _parse(d, source)


def _require(cond: bool, source: str, field: str, problem: str) -> None:
    if not cond:
        raise CodecConfigError(f"{source}: {field}: {problem}")


def _int(d: Mapping[str, Any], key: str, source: str, field: str) -> int:
    value = d.get(key)
    _require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
             source, f"{field}.{key}" if field else key, f"must be a positive integer, got {value!r}")
    return int(value)


def _parse(d: Mapping[str, Any], source: str) -> CodecConfig:
    _require(d.get("model_type") == MODEL_TYPE, source, "model_type",
             f"expected {MODEL_TYPE!r}, got {d.get('model_type')!r}")
    qk = d.get("quantizer_kwargs")
    _require(isinstance(qk, Mapping), source, "quantizer_kwargs", "missing or not an object")
    qtype = qk.get("quantizer_type", d.get("quantizer_type"))
    _require(qtype == "rlfq", source, "quantizer_type", f"only 'rlfq' is supported, got {qtype!r}")
    sr = _int(d, "sampling_rate", source, "")
    ds = _int(d, "downsample_rate", source, "")
    channels = _int(d, "number_channels", source, "")
    # Only the published stereo layout is supported: two channels flattened into one stream.
    _require(channels == 2, source, "number_channels", f"expected 2 (stereo), got {channels}")
    _require(d.get("enable_channel_interleave") is True, source, "enable_channel_interleave",
             "must be true (the codec runs on the interleaved L/R stream)")
    q = QuantizerConfig(**{k: _int(qk, k, source, "quantizer_kwargs") for k in (
        "input_dim", "rvq_dim", "output_dim", "num_quantizers", "codebook_size", "codebook_dim")})
    default_ctx = float(d.get("causal_transformer_context_duration", 10.0))
    stream_rate = float(sr * channels)
    encoder, rate, dim = _parse_stack(d, "encoder_kwargs", True, stream_rate, 1, default_ctx, source)
    _require(math.prod(s.patch_size for s in encoder if isinstance(s, PatchStage)) == ds * channels,
             source, "encoder_kwargs", f"patch sizes must multiply to downsample_rate x channels = {ds * channels}")
    _require(dim == q.input_dim, source, "encoder_kwargs",
             f"last output dimension {dim} != quantizer_kwargs.input_dim {q.input_dim}")
    decoder, rate, dim = _parse_stack(d, "decoder_kwargs", False, rate, q.output_dim, default_ctx, source)
    _require(math.prod(s.patch_size for s in decoder if isinstance(s, PatchStage)) == ds * channels,
             source, "decoder_kwargs", f"patch sizes must multiply to downsample_rate x channels = {ds * channels}")
    _require(dim == 1, source, "decoder_kwargs", f"must end with a single waveform channel, got {dim}")
    return CodecConfig(sr, ds, channels, encoder, decoder, q, source)


def _parse_stack(d, key, downsample, rate, dim, default_ctx, source):
    """Walk one stack tracking channel dimension and frame rate (windows depend on the rate)."""
    modules = d.get(key)
    _require(isinstance(modules, list) and modules, source, key, "missing or empty list")
    stages: list[Stage] = []
    for i, m in enumerate(modules):
        field = f"{key}[{i}]"
        _require(isinstance(m, Mapping), source, field, "not an object")
        kind = m.get("module_type")
        if kind == "PatchedPretransform":
            h = _int(m, "patch_size", source, field)
            if downsample:
                dim, rate = dim * h, rate / h
            else:
                _require(dim % h == 0, source, field, f"dimension {dim} not divisible by patch_size {h}")
                dim, rate = dim // h, rate * h
            stages.append(PatchStage(h))
            continue
        _require(kind == "Transformer", source, f"{field}.module_type", f"unknown module type {kind!r}")
        for flag, want in (("causal", True), ("norm", "layer_norm"), ("positional_embedding", "rope"),
                           ("gating", "none")):
            _require(m.get(flag, want) == want, source, f"{field}.{flag}", f"only {want!r} is supported")
        t = {k: _int(m, k, source, field) for k in (
            "input_dimension", "output_dimension", "d_model", "num_heads", "num_layers", "dim_feedforward")}
        _require(t["input_dimension"] == dim, source, f"{field}.input_dimension",
                 f"expected {dim} from the previous module, got {t['input_dimension']}")
        _require(t["d_model"] % t["num_heads"] == 0 and (t["d_model"] // t["num_heads"]) % 2 == 0,
                 source, f"{field}.num_heads", "d_model / num_heads must be an even integer (RoPE pairs)")
        scale = m.get("layer_scale")
        _require(isinstance(scale, (int, float)), source, f"{field}.layer_scale", "must be a number")
        duration = float(m.get("context_duration", default_ctx))
        context = int(round(rate * duration))  # upstream: int(round(frame_rate * context_duration))
        _require(context >= 1, source, f"{field}.context_duration", f"gives a window of {context} keys")
        stages.append(TransformerStage(context=context, max_period=float(m.get("max_period", 10000)),
                                       layer_scale=float(scale), **t))
        dim = t["output_dimension"]
    return tuple(stages), rate, dim


# --------------------------------------------------------------------------------------------
# Reference configs
# --------------------------------------------------------------------------------------------

def _transformer(i: int, o: int, ctx: float, d: int = 768, heads: int = 12, layers: int = 12,
                 ff: int = 3072, layer_scale: float = 0.01) -> dict[str, Any]:
    return {"module_type": "Transformer", "input_dimension": i, "output_dimension": o, "d_model": d,
            "num_heads": heads, "num_layers": layers, "dim_feedforward": ff, "causal": True,
            "norm": "layer_norm", "positional_embedding": "rope", "max_period": 10000, "gating": "none",
            "layer_scale": layer_scale, "conv_layout": True, "context_duration": ctx}


def _patch(h: int) -> dict[str, Any]:
    return {"module_type": "PatchedPretransform", "patch_size": h}


def _interleave(patches: list[int], transformers: list[dict[str, Any]], patch_first: bool) -> list:
    out: list[dict[str, Any]] = []
    for p, t in zip(patches, transformers):
        out += [_patch(p), t] if patch_first else [t, _patch(p)]
    return out


def _config(encoder: list, decoder: list, quantizer: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_type": MODEL_TYPE, "sampling_rate": 48000, "downsample_rate": 3840,
        "number_channels": 2, "enable_channel_interleave": True,
        "causal_transformer_context_duration": 10.0,
        # Backend/dtype preferences: do not change the math; the parser ignores them.
        "attention_implementation": "sdpa", "compute_dtype": "fp32", "codec_weight_dtype": "fp32",
        "code_dim": quantizer["input_dim"], "quantizer_type": "rlfq",
        "quantizer_kwargs": dict(quantizer, quantizer_type="rlfq"),
        "encoder_kwargs": encoder, "decoder_kwargs": decoder,
    }


def real_codec_config_dict() -> dict[str, Any]:
    """The real-size v2 codec (2,123,701,248 parameters), as in the published config.json.

    Stage table from spec section 3.2 and public copies of the v2 configuration class; the
    backend/dtype keys carry the config-class defaults (the published file may differ there).
    """
    big = dict(d=1280, heads=20, layers=32, ff=5120)
    encoder = _interleave([240, 2, 2, 2, 2, 2], [
        _transformer(240, 384, 1.0), _transformer(768, 384, 2.0), _transformer(768, 384, 4.0),
        _transformer(768, 384, 8.0), _transformer(768, 640, 10.0), _transformer(1280, 768, 10.0, **big)],
        patch_first=True)
    decoder = _interleave([2, 2, 2, 2, 2, 240], [
        _transformer(768, 1280, 10.0, **big), _transformer(640, 768, 10.0), _transformer(384, 768, 8.0),
        _transformer(384, 768, 4.0), _transformer(384, 768, 2.0), _transformer(384, 240, 1.0)],
        patch_first=False)
    return _config(encoder, decoder, {"input_dim": 768, "rvq_dim": 512, "output_dim": 768,
                                      "num_quantizers": 32, "codebook_size": 1024, "codebook_dim": 8})


def tiny_codec_config_dict() -> dict[str, Any]:
    """Same 12+12 topology, rates and quantizer as the real codec, with 1-layer d=32 stages.

    Decoder windows are 4, 8, 16, 24, 40, 64 keys (stage rates 12.5 .. 400 Hz): all shorter
    than a 40-frame test sequence, so streaming ring buffers wrap at every stage.
    """
    tiny = dict(d=32, heads=2, layers=1, ff=64, layer_scale=0.1)
    encoder = _interleave([240, 2, 2, 2, 2, 2], [
        _transformer(240, 8, 0.02, **tiny), _transformer(16, 8, 0.04, **tiny),
        _transformer(16, 8, 0.08, **tiny), _transformer(16, 8, 0.16, **tiny),
        _transformer(16, 16, 0.32, **tiny), _transformer(32, 16, 0.32, **tiny)], patch_first=True)
    decoder = _interleave([2, 2, 2, 2, 2, 240], [
        _transformer(16, 32, 0.32, **tiny), _transformer(16, 16, 0.32, **tiny),
        _transformer(8, 16, 0.32, **tiny), _transformer(8, 16, 0.24, **tiny),
        _transformer(8, 16, 0.2, **tiny), _transformer(8, 240, 0.16, **tiny)], patch_first=False)
    # rvq_dim differs from input/output dims (as in the real 768/512/768) so the weight-normed
    # projections exist: upstream drops them when the dims are equal.
    return _config(encoder, decoder, {"input_dim": 16, "rvq_dim": 24, "output_dim": 16,
                                      "num_quantizers": 32, "codebook_size": 1024, "codebook_dim": 8})
