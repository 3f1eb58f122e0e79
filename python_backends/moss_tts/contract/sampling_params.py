"""Per-request sampling parameters, validated once at the edge of the system."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from .tensors import (AUDIO_REPETITION_PENALTY, AUDIO_TEMPERATURE, AUDIO_TOP_K, AUDIO_TOP_P, DEFAULT_MAX_FRAMES,  # noqa: F401
                      MAX_FRAMES, MAX_REPETITION_PENALTY, MAX_TEMPERATURE, STOP_TEMPERATURE, STOP_TOP_K, STOP_TOP_P)


class SamplingError(ValueError):
    """A sampling parameter is out of range; the message names it and the allowed range."""


def derive_row_seed(seed: int) -> int:
    """User seed -> the 31-bit row seed used by the counter-based sampler (SGLang-Omni's rule)."""
    digest = hashlib.blake2b(f"moss-tts:{int(seed)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class ChannelParams:
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float = 1.0

    def validate(self, channel: str) -> None:
        if not (self.temperature >= 0.0) or self.temperature > MAX_TEMPERATURE:
            raise SamplingError(f"{channel} temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise SamplingError(f"{channel} top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise SamplingError(f"{channel} top_k must be -1 (off), 0 (off) or positive, got {self.top_k}")
        if not (0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY):
            raise SamplingError(f"{channel} repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], "
                                f"got {self.repetition_penalty}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SamplingParams:
    audio: ChannelParams = ChannelParams(AUDIO_TEMPERATURE, AUDIO_TOP_P, AUDIO_TOP_K, AUDIO_REPETITION_PENALTY)
    stop: ChannelParams = ChannelParams(STOP_TEMPERATURE, STOP_TOP_P, STOP_TOP_K)
    seed: int | None = None
    max_frames: int = DEFAULT_MAX_FRAMES
    ignore_stop: bool = False
    # Resolved once so a request keeps one random stream even when it is not seeded by the user.
    row_seed: int = field(default=-1)

    def __post_init__(self) -> None:
        self.audio.validate("audio")
        self.stop.validate("stop")
        if self.stop.repetition_penalty != 1.0:
            raise SamplingError("the stop head has no repetition penalty; leave it at 1.0")
        if self.seed is not None and not (0 <= int(self.seed) < 2**63):
            raise SamplingError(f"seed must be a non-negative 64-bit integer, got {self.seed}")
        if not (1 <= int(self.max_frames) <= MAX_FRAMES):
            raise SamplingError(f"max_frames must be in [1, {MAX_FRAMES}] (30 min), got {self.max_frames}")
        if self.row_seed < 0:
            row = derive_row_seed(self.seed) if self.seed is not None else secrets.randbits(31)
            object.__setattr__(self, "row_seed", row)

    @classmethod
    def greedy(cls, **kwargs) -> "SamplingParams":
        """Argmax on every channel (the stop head too, which may then never stop)."""
        return cls(audio=ChannelParams(0.0, 1.0, 0, kwargs.pop("repetition_penalty", 1.0)),
                   stop=ChannelParams(0.0, 1.0, 0), **kwargs)
