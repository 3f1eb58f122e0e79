"""Engine configuration: one frozen dataclass, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

MAX_RUNNING_REQUESTS = 16
MAX_QUEUE = 256
MAX_SEQ_LEN = 4096 + 1024  # tokens per slot: prompt rows + generated frames
FIRST_CHUNK_FRAMES = 2  # 160 ms at 12.5 frames/s: small, for a short time to first audio
CHUNK_FRAMES = 10  # 800 ms at 12.5 frames/s
PREFILL_CHUNK_TOKENS = 2048

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineConfigError(ValueError):
    """An EngineConfig field is out of range; the message names the field."""


def _require_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineConfigError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class EngineConfig:
    max_running_requests: int = MAX_RUNNING_REQUESTS
    max_queue: int = MAX_QUEUE
    max_seq_len: int = MAX_SEQ_LEN
    first_chunk_frames: int = FIRST_CHUNK_FRAMES
    chunk_frames: int = CHUNK_FRAMES
    # Prompt tokens prefilled per engine step: admission stops once a step's budget is used
    # (a longer prompt is still admitted alone) and one prefill forward covers at most this
    # many rows, so a burst of long prompts cannot stall the running streams for long.
    prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS
    # None = follow the model's parameters; when given, they must match the model.
    device: Optional[str] = None
    dtype: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "max_queue", "max_seq_len", "first_chunk_frames",
                     "chunk_frames", "prefill_chunk_tokens"):
            _require_positive(name, getattr(self, name))
        if self.max_seq_len < 2:
            raise EngineConfigError(f"EngineConfig.max_seq_len must be >= 2 (one prompt row and one "
                                    f"frame), got {self.max_seq_len}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise EngineConfigError(f"EngineConfig.dtype must be one of {sorted(DTYPES)} or None, "
                                    f"got {self.dtype!r}")
        if self.device is not None:
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as exc:
                raise EngineConfigError(f"EngineConfig.device {self.device!r} is not a torch device "
                                        f"({exc})") from None

    @property
    def torch_dtype(self) -> Optional[torch.dtype]:
        return None if self.dtype is None else DTYPES[self.dtype]

    def check_model(self, device: torch.device, dtype: torch.dtype, max_positions: int) -> None:
        """Raise if this config contradicts the loaded model (the engine never moves it)."""
        wanted = None if self.device is None else torch.device(self.device)
        # "cuda" matches the model on any cuda index; "cuda:1" only cuda:1.
        if wanted is not None and (wanted.type != device.type
                                   or wanted.index not in (None, device.index)):
            raise EngineConfigError(f"EngineConfig.device={self.device!r} but the model is on "
                                    f"{device}: load the model there or leave device unset")
        if self.dtype is not None and self.torch_dtype != dtype:
            raise EngineConfigError(f"EngineConfig.dtype={self.dtype!r} but the model is {dtype}: "
                                    f"load the model in that dtype or leave dtype unset")
        if self.max_seq_len > max_positions:
            raise EngineConfigError(f"EngineConfig.max_seq_len={self.max_seq_len} exceeds the model's "
                                    f"max_position_embeddings ({max_positions})")
