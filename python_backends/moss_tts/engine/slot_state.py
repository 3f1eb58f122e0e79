"""Per-slot generation state on the device: what a decode step reads and writes for each KV slot.

Everything a step needs lives here, addressed by slot, so a decode step over slots [0, S) takes
no input from the host at all: the fed-back codes, each slot's KV length and frame count, its
sampling parameters, code history and whether it is still generating. That is what lets one
CUDA graph per shape replay every step, and the host enqueue step N+1 before it has read step N.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..contract.sampling_params import SamplingParams
from ..model.config import MossTTSConfig
from ..model.sampler import ChannelTensors, FrameSampling

# Column order of PrefillInputs.floats / .ints (one row per admitted request).
FLOAT_PARAMS = ("stop.temperature", "stop.top_p", "stop.repetition_penalty",
                "audio.temperature", "audio.top_p", "audio.repetition_penalty")
INT_PARAMS = ("stop.top_k", "audio.top_k", "seed", "max_frames", "ignore_stop")


def param_rows(params: SamplingParams) -> tuple[list[float], list[int]]:
    """One request's parameters as the float and int rows of PrefillInputs."""
    floats = [params.stop.temperature, params.stop.top_p, params.stop.repetition_penalty,
              params.audio.temperature, params.audio.top_p, params.audio.repetition_penalty]
    ints = [params.stop.top_k, params.audio.top_k, params.row_seed, params.max_frames,
            int(params.ignore_stop)]
    return floats, ints


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
        s = self.sampling
        float_dst = (s.stop.temperature, s.stop.top_p, s.stop.repetition_penalty,
                     s.audio.temperature, s.audio.top_p, s.audio.repetition_penalty)
        for i, dst in enumerate(float_dst):
            dst.index_copy_(0, slots, floats[:, i])
        for i, dst in enumerate((s.stop.top_k, s.audio.top_k, s.seed, self.max_frames)):
            dst.index_copy_(0, slots, ints[:, i])
        self.ignore_stop.index_copy_(0, slots, ints[:, 4].bool())
        s.seen.index_fill_(0, slots, False)
        self.frame_index.index_fill_(0, slots, 0)

    def deactivate(self, slots: torch.Tensor) -> None:
        """Freed slots stop generating: one fill on the stream for all of them, no host sync
        (slots: a device index tensor, uploaded without waiting: uploads.upload_index)."""
        self.active.index_fill_(0, slots, False)

    def reset(self) -> None:
        """Every slot idle (after graph capture, whose warm-up runs wrote slot rows)."""
        for t in (self.ignore_stop, self.max_frames, self.frame_index, self.lengths, self.active,
                  self.last_codes, self.sampling.seen):
            t.zero_()
