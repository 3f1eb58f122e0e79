"""Frozen configuration of MOSS-TTS-Local-Transformer-v1.5, read from the real config.json.

The published config nests the Qwen3 backbone under `qwen3_config` (mirrored as
`language_config`) and the local transformer under `gpt2_config`. Everything is validated
once here; model code trusts these objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..contract.tensors import CODEBOOK_SIZE, N_VQ, SAMPLE_RATE


class ConfigError(ValueError):
    """A config file is missing a field or holds a value this implementation cannot serve."""


def read_config_json(directory: str | Path, error: type[ValueError], missing: str) -> tuple[Any, str]:
    """A checkpoint directory's config.json (the model's or the codec's) and its path, for messages;
    `error` when it is missing (`missing` says what was expected) or not JSON."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise error(f"{path}: {missing}")
    try:
        return json.loads(path.read_text(encoding="utf-8")), str(path)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from exc


def _get(d: Mapping[str, Any], key: str, source: str, default: Any = ..., cast=None) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise ConfigError(f"{source}: required field {key!r} is missing")
        return default
    value = d[key]
    if cast is None:
        return value
    try:
        return cast(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: field {key!r}={value!r} is not a valid {cast.__name__}") from exc


def _require(ok: bool, source: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{source}: {message}")


@dataclass(frozen=True)
class Qwen3Config:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str) -> "Qwen3Config":
        hidden = _get(d, "hidden_size", source, cast=int)
        heads = _get(d, "num_attention_heads", source, cast=int)
        # transformers 5 moved rope_theta into rope_parameters; accept both spellings.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        theta = d.get("rope_theta", rope.get("rope_theta") if isinstance(rope, dict) else None)
        cfg = cls(
            hidden_size=hidden,
            num_hidden_layers=_get(d, "num_hidden_layers", source, cast=int),
            num_attention_heads=heads,
            num_key_value_heads=_get(d, "num_key_value_heads", source, heads, cast=int),
            head_dim=_get(d, "head_dim", source, hidden // heads, cast=int),
            intermediate_size=_get(d, "intermediate_size", source, cast=int),
            vocab_size=_get(d, "vocab_size", source, cast=int),
            rope_theta=float(theta if theta is not None else 1e6),
            rms_norm_eps=_get(d, "rms_norm_eps", source, 1e-6, cast=float),
            # Not published for this checkpoint; 32768 is what Qwen3-4B ships with.
            max_position_embeddings=_get(d, "max_position_embeddings", source, 32768, cast=int),
        )
        _require(cfg.num_attention_heads % cfg.num_key_value_heads == 0, source,
                 "qwen3_config.num_attention_heads must be a multiple of num_key_value_heads")
        _require(cfg.head_dim % 2 == 0, source, "qwen3_config.head_dim must be even for RoPE")
        _require(not d.get("attention_bias", False), source,
                 "qwen3_config.attention_bias=true is not supported (Qwen3 has no attention bias)")
        act = d.get("hidden_act", "silu")
        _require(act == "silu", source, f"qwen3_config.hidden_act must be 'silu', got {act!r}")
        return cfg


@dataclass(frozen=True)
class LocalTransformerConfig:
    """The one-layer GPT-2-style block that samples the 12 codebooks of one frame."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    rope_base: float
    layer_norm_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], num_layers: int, source: str) -> "LocalTransformerConfig":
        hidden = _get(d, "n_embd", source, cast=int)
        cfg = cls(
            hidden_size=hidden,
            num_layers=num_layers,
            num_heads=_get(d, "n_head", source, cast=int),
            intermediate_size=_get(d, "n_inner", source, 4 * hidden, cast=int),
            rope_base=_get(d, "rope_base", source, 10000.0, cast=float),
            layer_norm_eps=_get(d, "layer_norm_epsilon", source, 1e-5, cast=float),
        )
        _require(hidden % cfg.num_heads == 0 and cfg.head_dim % 2 == 0, source,
                 "gpt2_config.n_embd / n_head must be an even integer head size")
        pos = str(d.get("position_embedding_type", "absolute")).lower()
        _require(pos == "rope", source, f"gpt2_config.position_embedding_type must be 'rope', got {pos!r}")
        act = d.get("activation_function", "silu")
        _require(act == "silu", source, f"gpt2_config.activation_function must be 'silu', got {act!r}")
        _require(bool(d.get("scale_attn_weights", True)) and not d.get("scale_attn_by_inverse_layer_idx", False),
                 source, "gpt2_config must use plain 1/sqrt(head_dim) attention scaling")
        return cfg


@dataclass(frozen=True)
class MossTTSConfig:
    backbone: Qwen3Config
    local: LocalTransformerConfig
    n_vq: int = 12
    audio_vocab_size: int = 1024
    audio_pad_code: int = 1024
    pad_token_id: int = 151643
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    audio_start_token_id: int = 151669
    audio_end_token_id: int = 151670
    audio_user_slot_token_id: int = 151654
    audio_assistant_slot_token_id: int = 151656
    sampling_rate: int = 48000
    audio_tokenizer_name_or_path: str = "OpenMOSS-Team/MOSS-Audio-Tokenizer-v2"
    source: str = field(default="<memory>", compare=False)

    # Frames per second of the codec (48 kHz / 3840 samples per frame).
    frame_rate: float = 12.5

    @property
    def hidden_size(self) -> int:
        return self.backbone.hidden_size

    @property
    def row_width(self) -> int:
        """Channels per prompt row: one text id plus n_vq codes."""
        return self.n_vq + 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> "MossTTSConfig":
        model_type = d.get("model_type", "moss_tts_local")
        _require(model_type == "moss_tts_local", source, f"model_type must be 'moss_tts_local', got {model_type!r}")
        qwen = d.get("qwen3_config") or d.get("language_config")
        _require(isinstance(qwen, dict), source, "field 'qwen3_config' (or 'language_config') is missing")
        gpt2 = d.get("gpt2_config")
        _require(isinstance(gpt2, dict), source, "field 'gpt2_config' is missing")
        n_layers = int(d.get("local_transformer_layers", gpt2.get("n_layer", 1)))
        n_vq = _get(d, "n_vq", source, 12, cast=int)
        audio_vocab = _get(d, "audio_vocab_size", source, 1024, cast=int)
        pad_code = int(d.get("audio_pad_code", d.get("audio_pad_token_id", 1024)))
        cfg = cls(
            backbone=Qwen3Config.from_dict(qwen, f"{source} [qwen3_config]"),
            local=LocalTransformerConfig.from_dict(gpt2, n_layers, f"{source} [gpt2_config]"),
            n_vq=n_vq,
            audio_vocab_size=audio_vocab,
            audio_pad_code=pad_code,
            pad_token_id=_get(d, "pad_token_id", source, 151643, cast=int),
            im_start_token_id=_get(d, "im_start_token_id", source, 151644, cast=int),
            im_end_token_id=_get(d, "im_end_token_id", source, 151645, cast=int),
            audio_start_token_id=_get(d, "audio_start_token_id", source, 151669, cast=int),
            audio_end_token_id=_get(d, "audio_end_token_id", source, 151670, cast=int),
            audio_user_slot_token_id=_get(d, "audio_user_slot_token_id", source, 151654, cast=int),
            audio_assistant_slot_token_id=int(d.get("audio_assistant_gen_slot_token_id")
                                              or d.get("audio_assistant_slot_token_id") or 151656),
            sampling_rate=_get(d, "sampling_rate", source, 48000, cast=int),
            audio_tokenizer_name_or_path=str(d.get("audio_tokenizer_name_or_path")
                                             or "OpenMOSS-Team/MOSS-Audio-Tokenizer-v2"),
            source=source,
        )
        cfg._validate(d)
        return cfg

    def _validate(self, d: Mapping[str, Any]) -> None:
        src = self.source
        # The served contract (moss_tts.contract: pbtxt shapes, clients) is the released model's.
        _require(self.n_vq == N_VQ, src, f"n_vq must be {N_VQ} (this release is trained with {N_VQ} codebooks), "
                 f"got {self.n_vq}")
        _require(self.audio_vocab_size == CODEBOOK_SIZE, src,
                 f"audio_vocab_size must be {CODEBOOK_SIZE} (the codec's codebook size), got {self.audio_vocab_size}")
        sizes = d.get("audio_codebook_sizes") or [self.audio_vocab_size] * self.n_vq
        _require(len(sizes) == self.n_vq and all(int(s) == self.audio_vocab_size for s in sizes), src,
                 f"audio_codebook_sizes must be {self.n_vq} x {self.audio_vocab_size}, got {sizes}")
        _require(self.audio_pad_code >= self.audio_vocab_size, src,
                 f"audio_pad_code ({self.audio_pad_code}) must lie outside the audio vocab ({self.audio_vocab_size})")
        _require(self.local.hidden_size == self.backbone.hidden_size, src,
                 f"gpt2_config.n_embd ({self.local.hidden_size}) must equal qwen3_config.hidden_size "
                 f"({self.backbone.hidden_size}): the codebook heads are tied to the audio embeddings")
        mode = str(d.get("local_text_head_mode", "binary")).lower()
        _require(mode == "binary", src, f"local_text_head_mode must be 'binary', got {mode!r}")
        _require(self.sampling_rate == SAMPLE_RATE, src, f"sampling_rate must be {SAMPLE_RATE}, got {self.sampling_rate}")
        vocab = self.backbone.vocab_size
        for name in ("pad_token_id", "im_start_token_id", "im_end_token_id", "audio_start_token_id",
                     "audio_end_token_id", "audio_user_slot_token_id", "audio_assistant_slot_token_id"):
            value = getattr(self, name)
            _require(0 <= value < vocab, src, f"{name}={value} is outside the text vocab ({vocab})")

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "MossTTSConfig":
        data, source = read_config_json(directory, ConfigError,
                                        "not found (expected a MOSS-TTS-Local-Transformer-v1.5 model directory)")
        return cls.from_dict(data, source)


def real_model_config_dict() -> dict[str, Any]:
    """The published config.json of MOSS-TTS-Local-Transformer-v1.5 (values per the spec)."""
    qwen3 = {
        "model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728, "vocab_size": 151936,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
        "tie_word_embeddings": True, "max_position_embeddings": 32768,
    }
    gpt2 = {
        "model_type": "gpt2", "n_embd": 2560, "n_head": 32, "n_inner": 9728, "n_layer": 1,
        "n_positions": 13, "n_ctx": 13, "position_embedding_type": "rope", "rope_base": 1000000.0,
        "activation_function": "silu", "layer_norm_epsilon": 1e-6, "scale_attn_weights": True,
        "vocab_size": 151936,
    }
    return {
        "architectures": ["MossTTSLocalModel"], "model_type": "moss_tts_local",
        "qwen3_config": qwen3, "language_config": dict(qwen3), "gpt2_config": gpt2,
        "n_vq": 12, "audio_vocab_size": 1024, "audio_codebook_sizes": [1024] * 12,
        "audio_pad_token_id": 1024, "audio_pad_code": 1024, "pad_token_id": 151643,
        "im_start_token_id": 151644, "im_end_token_id": 151645, "audio_start_token_id": 151669,
        "audio_end_token_id": 151670, "audio_user_slot_token_id": 151654,
        "audio_assistant_slot_token_id": 151656, "audio_assistant_gen_slot_token_id": 151656,
        "sampling_rate": 48000, "audio_tokenizer_name_or_path": "OpenMOSS-Team/MOSS-Audio-Tokenizer-v2",
        "local_transformer_layers": 1, "local_text_head_mode": "binary", "use_static_local_kv_cache": True,
        "tie_word_embeddings": True,
    }
