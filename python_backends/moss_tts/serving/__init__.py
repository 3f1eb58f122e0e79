"""Serving components that sit between the Triton adapters and the model code.

Nothing here imports Triton: every class is driven by plain tensors and bytes, so the
behaviour (caching, single-flight, per-stream vocoder slots) is tested on CPU with pytest.
"""

from .lru import TensorLRU
from .ref_cache import ReferenceCacheConfig, ReferenceCacheStats, ReferenceEncoder, encoder_hash, reference_key
from .vocoder_sessions import NoFreeSlot, VocoderConfig, VocoderSessions, VocoderStats

__all__ = [
    "NoFreeSlot", "ReferenceCacheConfig", "ReferenceCacheStats", "ReferenceEncoder", "TensorLRU",
    "VocoderConfig", "VocoderSessions", "VocoderStats", "encoder_hash", "reference_key",
]
