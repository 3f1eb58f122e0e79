"""One synthesis request: the immutable ask (EngineRequest) and its runtime state (RequestState)."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from ..contract.sampling_params import SamplingParams
from ..contract.tensors import FRAME_RATE
from ..model.config import MossTTSConfig
from .config import EngineConfig
from .events import CodesChunk
from .prefix_cache import BlockNames, PrefixMatch
from .slot_state import param_rows


@dataclass(frozen=True, eq=False)
class EngineRequest:
    """What to synthesize: prompt rows + sampling parameters -> frames of 12 codes, streamed."""

    request_id: str
    prompt_rows: torch.Tensor  # [T, 13] int64: text id + 12 codes per row (processor.PromptBuilder)
    params: SamplingParams
    first_chunk_frames: Optional[int] = None  # None = EngineConfig.first_chunk_frames
    chunk_frames: Optional[int] = None  # None = EngineConfig.chunk_frames

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty string, got {self.request_id!r}")
        rows = self.prompt_rows
        if not isinstance(rows, torch.Tensor) or rows.dtype != torch.long or rows.ndim != 2 or rows.shape[0] == 0:
            raise ValueError(f"request {self.request_id!r}: prompt_rows must be an int64 tensor [T>0, 13], got "
                             f"{getattr(rows, 'dtype', type(rows).__name__)} {list(getattr(rows, 'shape', []))}")
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"request {self.request_id!r}: params must be a SamplingParams, got "
                             f"{type(self.params).__name__}")
        for name in ("first_chunk_frames", "chunk_frames"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"request {self.request_id!r}: {name} must be an integer >= 1 or None, "
                                 f"got {value!r}")

    @property
    def prompt_len(self) -> int:
        return self.prompt_rows.shape[0]

    @property
    def max_seq_len(self) -> int:
        """KV rows the request can need: its prompt plus one fed-back row per frame."""
        return self.prompt_len + self.params.max_frames

    def check_fits(self, model_cfg: MossTTSConfig, config: EngineConfig) -> None:
        """Raise ValueError if this request cannot run on this model and engine."""
        rid, rows = self.request_id, self.prompt_rows
        if rows.shape[1] != model_cfg.row_width:
            raise ValueError(f"request {rid!r}: prompt rows must have {model_cfg.row_width} columns, "
                             f"got {rows.shape[1]}")
        if self.max_seq_len > config.max_seq_len:
            raise ValueError(f"request {rid!r}: prompt ({self.prompt_len} rows) + max_frames "
                             f"({self.params.max_frames}) exceeds EngineConfig.max_seq_len "
                             f"({config.max_seq_len}); shorten the prompt or lower max_frames")
        # numpy: runs on the caller's (a stream's) thread, where each torch call would give up the GIL
        array = rows.numpy()
        text, codes = array[:, 0], array[:, 1:]
        if int(text.min()) < 0 or int(text.max()) >= model_cfg.backbone.vocab_size:
            raise ValueError(f"request {rid!r}: text ids must lie in [0, {model_cfg.backbone.vocab_size})")
        if int(codes.min()) < 0 or int(codes.max()) > model_cfg.audio_pad_code:
            raise ValueError(f"request {rid!r}: codes must lie in [0, {model_cfg.audio_pad_code}] "
                             f"({model_cfg.audio_pad_code} = no code)")


def chunk_target(num_flushed: int, first_chunk_frames: int, chunk_frames: int, doubling: bool = False) -> int:
    """Frames the next chunk carries: a short first chunk for latency, then chunks that grow by
    what was already sent (2, 4, 8, 10, 10, ... for 2 and 10) up to `chunk_frames`. `doubling`: the
    chunks after the first are as large as what was already sent (2, 2, 4, 8, 10, ...).

    Why grow: a listener starts playing at the first chunk, so chunk k must arrive before the
    audio sent before it has played out. Its frames take (its size) engine steps to generate,
    and a chunk no larger than the audio already sent (+ the first chunk) keeps that deadline at
    any engine pace faster than about real time x 2 (a step under ~40 ms of the 80 ms a frame
    plays), with the rest of the buffer left for the vocoder's queueing jitter. A steady 10 after
    a 2-frame first chunk needs 10 steps inside the first chunk's 160 ms: it ran dry at every
    concurrency above 16 (docs/scaling.md). A first chunk at least as big as `chunk_frames`
    makes every chunk `chunk_frames`.

    Why doubling: at 256 streams the second chunk (4 frames, due within the first chunk's 160
    ms) came late in 255 of 282 underruns, by 121 ms on average: the steps while a wave of new
    streams is admitted took 44 ms a second in, longer before (issue 34, round 13). Doubling makes
    the second chunk 2 frames (in time at steps under ~65 ms, with ~30 ms of vocoder jitter) and
    the later ones in time at steps under ~43-52 ms, for one chunk more."""
    if num_flushed == 0:
        return first_chunk_frames
    return min(chunk_frames, max(num_flushed, first_chunk_frames) if doubling else num_flushed + first_chunk_frames)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class RequestState:
    request: EngineRequest
    first_chunk_frames: int
    chunk_frames: int
    chunk_doubling: bool = False  # EngineConfig.chunk_doubling (chunk_target)
    status: RequestStatus = RequestStatus.WAITING
    slot: Optional[int] = None
    prefix: Optional[PrefixMatch] = None  # pool blocks its prompt loads; None with reuse off
    num_frames: int = 0  # frames generated = the index of the next frame
    num_issued: int = 0  # frames launched on the device (ahead of num_frames while a step runs)
    num_flushed: int = 0  # frames delivered in chunks
    # n_vq codes per frame not yet delivered, as lists of ints (Engine._complete says why)
    pending: list[list[int]] = field(default_factory=list)
    is_abort_requested: bool = False
    # Derived from the request on the submitting thread (create), not on the engine's: a wave of
    # ~256 admissions would otherwise hash and convert every prompt inside the engine's step.
    block_names: Optional[BlockNames] = None  # its prompt's prefix-block names (None: reuse off)
    param_rows: Optional[tuple[list[float], list[int]]] = None  # slot_state.param_rows of its params
    # Chunk deadlines (chunk_deadlines.py): EngineConfig.chunk_deadline_ms in s (0: off), when the
    # first chunk left (monotonic), when the listener's audio runs out less the deadline, and how
    # many chunks left early.
    deadline_s: float = 0.0
    first_chunk_at: float = 0.0
    flush_at: float = math.inf
    early_chunks: int = 0
    # Where add_frame says "act now": the frame count of the next chunk (or of the frame
    # budget, if sooner). Kept, not recomputed: add_frame runs for every request every step.
    _due_at: int = 0

    def __post_init__(self) -> None:
        self._due_at = self._next_due()

    @classmethod
    def create(cls, request: EngineRequest, config: EngineConfig) -> "RequestState":
        """On the submitting thread: everything about the request the engine's admission would
        otherwise work out on its own thread (prefix-block hashes, parameter rows)."""
        first = request.first_chunk_frames or config.first_chunk_frames
        names = BlockNames.of(request.prompt_rows, config.prefix_block_rows) if config.prefix_blocks else None
        return cls(request, first, request.chunk_frames or config.chunk_frames, config.chunk_doubling,
                   block_names=names, param_rows=param_rows(request.params),
                   deadline_s=config.chunk_deadline_ms / 1000)

    def _next_due(self) -> int:
        chunk_end = self.num_flushed + chunk_target(self.num_flushed, self.first_chunk_frames, self.chunk_frames,
                                                    self.chunk_doubling)
        return min(chunk_end, self.request.params.max_frames)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    @property
    def is_running(self) -> bool:
        return self.status is RequestStatus.RUNNING

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def is_at_frame_budget(self) -> bool:
        return self.num_frames >= self.request.params.max_frames

    @property
    def can_issue(self) -> bool:
        """Another frame may be launched: the budget is not yet covered by launched frames."""
        return self.num_issued < self.request.params.max_frames

    @property
    def ends_first_chunk_when_issued(self) -> bool:
        """The frame just launched is the last of the first chunk (for Engine's first-audio hold)."""
        return self.num_flushed == 0 and self.num_issued == self._due_at

    def start(self, slot: int, prefix: Optional[PrefixMatch] = None) -> None:
        assert self.status is RequestStatus.WAITING, f"{self.request_id} started twice"
        self.status, self.slot, self.prefix = RequestStatus.RUNNING, slot, prefix

    def add_frame(self, codes: list[int]) -> bool:
        """Append one frame's codes [n_vq]; True when the pending frames make the next chunk
        (chunk_target) or the frame budget is reached, the only frames that need a look."""
        self.pending.append(codes)
        self.num_frames += 1
        return self.num_frames >= self._due_at

    def take_chunk(self, now: float = 0.0) -> Optional[CodesChunk]:
        """All pending frames as one chunk (None if there are none); they count as delivered.
        `now` (monotonic, 0: read here) dates the first chunk, from which the deadlines count."""
        if not self.pending:
            return None
        chunk = CodesChunk(self.request_id, np.array(self.pending, dtype=np.int32), self.num_flushed)
        self.num_flushed += len(self.pending)
        self.pending.clear()
        self._due_at = self._next_due()
        if self.deadline_s:
            if not self.first_chunk_at:
                self.first_chunk_at = now or time.monotonic()
            # the listener, playing from (about) then, runs out of what was sent at first + sent / rate
            self.flush_at = self.first_chunk_at + self.num_flushed / FRAME_RATE - self.deadline_s
        return chunk

    def finish(self) -> None:
        """Final transition; frees the per-request buffers (the caller frees the slot)."""
        assert self.status is not RequestStatus.FINISHED, f"{self.request_id} finished twice"
        self.status, self.slot, self.prefix = RequestStatus.FINISHED, None, None
        self.pending.clear()
