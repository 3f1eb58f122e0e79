"""What the engine tells its caller: codes in chunks, then exactly one Finished per request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

import numpy as np

FinishReason = Literal["stop", "max_frames", "cancelled", "error"]


@dataclass(frozen=True)
class CodesChunk:
    request_id: str
    # [num_frames, n_vq] int32. numpy, not torch: the engine thread builds one per chunk, and a
    # torch call there gives up the GIL and must win it back (up to a switch interval under load).
    codes: np.ndarray
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
