"""Per-request sampling parameters, validated once at the edge of the system. The channel
parameters' fields and checks follow from sampling_options.SAMPLING_OPTIONS."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field, make_dataclass

from .sampling_options import (AUDIO_REPETITION_PENALTY, AUDIO_TEMPERATURE, AUDIO_TOP_K, AUDIO_TOP_P,  # noqa: F401
                               MAX_REPETITION_PENALTY, MAX_TEMPERATURE, SAMPLING_OPTIONS, STOP_TEMPERATURE, STOP_TOP_K,
                               STOP_TOP_P)
from .tensors import DEFAULT_MAX_FRAMES, MAX_FRAMES


class SamplingError(ValueError):
    """A sampling parameter is out of range; the message names it and the allowed range."""


def derive_row_seed(seed: int) -> int:
    """User seed -> the 31-bit row seed used by the counter-based sampler (SGLang-Omni's rule)."""
    digest = hashlib.blake2b(f"moss-tts:{int(seed)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def _validate(self, channel: str) -> None:
    for option in SAMPLING_OPTIONS:
        value = getattr(self, option.name)
        problem = option.problem(value)
        if problem:
            raise SamplingError(f"{channel} {option.name} must be {problem}, got {value}")


# One channel's parameters (temperature, top_p, top_k, repetition_penalty, ...): a frozen dataclass
# whose fields are the declared options, in their order.
ChannelParams = make_dataclass(
    "ChannelParams",
    [(o.name, o.kind) if o.required else (o.name, o.kind, field(default=o.audio)) for o in SAMPLING_OPTIONS],
    frozen=True, namespace={"__module__": __name__, "validate": _validate,
                            "is_greedy": property(lambda self: self.temperature == 0.0)})


def channel_defaults(channel: str) -> ChannelParams:
    """The parameters a request gets on `channel` ("audio" or "stop") when it names none."""
    return ChannelParams(**{o.name: o.default(channel) for o in SAMPLING_OPTIONS})


@dataclass(frozen=True)
class SamplingParams:
    audio: ChannelParams = channel_defaults("audio")
    stop: ChannelParams = channel_defaults("stop")
    seed: int | None = None
    max_frames: int = DEFAULT_MAX_FRAMES
    ignore_stop: bool = False
    # Resolved once so a request keeps one random stream even when it is not seeded by the user.
    row_seed: int = field(default=-1)

    def __post_init__(self) -> None:
        self.audio.validate("audio")
        self.stop.validate("stop")
        for option in SAMPLING_OPTIONS:
            if not option.has_stop_input and getattr(self.stop, option.name) != option.stop:
                raise SamplingError(f"the stop head has no {option.name.replace('_', ' ')}; leave it at {option.stop}")
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
