"""MOSS-Audio-Tokenizer-v2 codec: 48 kHz stereo audio <-> 12.5 Hz frames of up to 32 codes."""

from .checkpoint import build_codec, build_real_size_codec, init_random_, load_codec, write_codec_checkpoint
from .codec_model import MossAudioCodec
from .config import (CodecConfig, CodecConfigError, PatchStage, QuantizerConfig, TransformerStage,
                     real_codec_config_dict, tiny_codec_config_dict)
from .streaming import CodecDecodeState

__all__ = [
    "CodecConfig", "CodecConfigError", "CodecDecodeState", "MossAudioCodec", "PatchStage", "QuantizerConfig",
    "TransformerStage", "build_codec", "build_real_size_codec", "init_random_", "load_codec",
    "real_codec_config_dict", "tiny_codec_config_dict", "write_codec_checkpoint",
]
