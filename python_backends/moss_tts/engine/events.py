"""What the engine tells its caller: codes in chunks, then exactly one Finished per request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

import torch

FinishReason = Literal["stop", "max_frames", "cancelled", "error"]


@dataclass(frozen=True)
class CodesChunk:
    request_id: str
    codes: torch.Tensor  # [num_frames, n_vq] int64, CPU
    frame_offset: int  # index of codes[0] among the request's frames

    @property
    def num_frames(self) -> int:
        return self.codes.shape[0]


@dataclass(frozen=True)
class Finished:
    """The last event of a request. num_frames = frames delivered in its CodesChunk events."""

    request_id: str
    reason: FinishReason
    error: Optional[str]
    num_frames: int


EngineEvent = Union[CodesChunk, Finished]
