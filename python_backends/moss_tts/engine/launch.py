"""Launch: one engine step in flight, between its launch and the reading of its frames."""

from __future__ import annotations

from dataclasses import dataclass

from .request import RequestState
from .runner import StepOutput


@dataclass(frozen=True)
class Launch:
    """A step in flight: its output and the requests (with their slots) whose rows it carries."""

    out: StepOutput
    prefilled: list[RequestState]  # output rows 0.. in order
    decoded: list[tuple[RequestState, int]]  # (request, slot): row decode_offset + slot
    ends_first_chunk: bool = False  # its frames complete some request's first chunk (first_audio_gate.py)

    @property
    def states(self) -> list[RequestState]:
        return list(dict.fromkeys([*self.prefilled, *(s for s, _ in self.decoded)]))
