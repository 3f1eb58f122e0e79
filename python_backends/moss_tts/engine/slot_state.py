"""Per-slot generation state on the device: what a decode step reads and writes for each KV slot.

Everything a step needs lives here, addressed by slot, so a decode step over slots [0, S) takes
no input from the host at all: the fed-back codes, each slot's KV length and frame count, its
sampling parameters, code history and whether it is still generating. That is what lets one
CUDA graph per shape replay every step, and the host enqueue step N+1 before it has read step N.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..contract.sampling_options import SAMPLING_OPTIONS
from ..contract.sampling_params import SamplingParams
from ..model.config import MossTTSConfig
from ..model.sampler import ChannelTensors, FrameSampling

# Column order of PrefillInputs.floats / .ints (one row per admitted request): each channel's
# sampling options of that kind (stop head first, in declaration order: sampling_options.py), then
# the request's own values.
CHANNEL_ORDER = ("stop", "audio")
REQUEST_INTS = {"seed": lambda p: p.row_seed, "max_frames": lambda p: p.max_frames,
                "ignore_stop": lambda p: int(p.ignore_stop)}


def _channel_columns(kind: type) -> tuple[str, ...]:
    return tuple(f"{channel}.{o.name}" for channel in CHANNEL_ORDER for o in SAMPLING_OPTIONS if o.kind is kind)


FLOAT_PARAMS = _channel_columns(float)
INT_PARAMS = (*_channel_columns(int), *REQUEST_INTS)


def _row_value(params: SamplingParams, column: str):
    channel, _, name = column.partition(".")
    return getattr(getattr(params, channel), name) if name else REQUEST_INTS[column](params)


def param_rows(params: SamplingParams) -> tuple[list[float], list[int]]:
    """One request's parameters as the float and int rows of PrefillInputs."""
    return [_row_value(params, c) for c in FLOAT_PARAMS], [_row_value(params, c) for c in INT_PARAMS]


def _view_channels(channels: ChannelTensors, n: int) -> ChannelTensors:
    return ChannelTensors(**{f.name: getattr(channels, f.name)[:n] for f in fields(channels)})


def _gather_channels(channels: ChannelTensors, slots: torch.Tensor) -> ChannelTensors:
    return ChannelTensors(**{f.name: getattr(channels, f.name).index_select(0, slots)
                             for f in fields(channels)})


@dataclass
class SlotState:
    sampling: FrameSampling  # parameters, row seeds and code history [slots, n_vq, vocab]
    ignore_stop: torch.Tensor  # [slots] bool
    max_frames: torch.Tensor  # [slots] int64
    frame_index: torch.Tensor  # [slots] int64: frames emitted so far = index of the next frame
    lengths: torch.Tensor  # [slots] int64: KV rows written = position of the next fed-back row
    active: torch.Tensor  # [slots] bool: the last frame was emitted and the budget is not used up
    last_codes: torch.Tensor  # [slots, n_vq] int64: the frame the next step feeds back

    @classmethod
    def allocate(cls, num_slots: int, cfg: MossTTSConfig, device: torch.device) -> "SlotState":
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)
        sampling = FrameSampling.build([SamplingParams(seed=0)] * num_slots, cfg.n_vq,
                                       cfg.audio_vocab_size, device)
        return cls(sampling, zeros(num_slots, dtype=torch.bool), zeros(num_slots), zeros(num_slots),
                   zeros(num_slots), zeros(num_slots, dtype=torch.bool), zeros(num_slots, cfg.n_vq))

    def view(self, n: int) -> FrameSampling:
        """Sampling state of slots [0, n) as views: updates land in the slots themselves."""
        s = self.sampling
        return FrameSampling(_view_channels(s.stop, n), _view_channels(s.audio, n), s.seed[:n], s.seen[:n])

    def gather(self, slots: torch.Tensor) -> FrameSampling:
        """Sampling state of `slots` as copies (write the history back with scatter_seen)."""
        s = self.sampling
        return FrameSampling(_gather_channels(s.stop, slots), _gather_channels(s.audio, slots),
                             s.seed.index_select(0, slots), s.seen.index_select(0, slots))

    def assign(self, slots: torch.Tensor, floats: torch.Tensor, ints: torch.Tensor) -> None:
        """Reset `slots` for newly admitted requests (rows as param_rows gives them)."""
        for i, column in enumerate(FLOAT_PARAMS):
            self._column(column).index_copy_(0, slots, floats[:, i])
        for i, column in enumerate(INT_PARAMS):
            dst = self._column(column)
            dst.index_copy_(0, slots, ints[:, i].to(dst.dtype))
        self.sampling.seen.index_fill_(0, slots, False)
        self.frame_index.index_fill_(0, slots, 0)

    def _column(self, column: str) -> torch.Tensor:
        """The per-slot tensor of a FLOAT_PARAMS / INT_PARAMS column."""
        channel, _, name = column.partition(".")
        if name:
            return getattr(getattr(self.sampling, channel), name)
        return {"seed": self.sampling.seed, "max_frames": self.max_frames, "ignore_stop": self.ignore_stop}[column]

    def deactivate(self, slots: torch.Tensor) -> None:
        """Freed slots stop generating: one fill on the stream for all of them, no host sync
        (slots: a device index tensor, uploaded without waiting: uploads.upload_index)."""
        self.active.index_fill_(0, slots, False)

    def reset(self) -> None:
        """Every slot idle (after graph capture, whose warm-up runs wrote slot rows)."""
        for t in (self.ignore_stop, self.max_frames, self.frame_index, self.lengths, self.active,
                  self.last_codes, self.sampling.seen):
            t.zero_()
