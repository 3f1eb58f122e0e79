"""Sampling state of every KV slot, slot-indexed on the device and gathered for each step.

A request's parameters, row seed, frame index and code history live in its slot's row from
admission to release, so a step only gathers the running rows and scatters back the history.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from ..model import FrameSampling
from ..sampler import ChannelTensors
from ..sampling_params import SamplingParams


def _gather_channels(channels: ChannelTensors, rows: torch.Tensor) -> ChannelTensors:
    return ChannelTensors(**{f.name: getattr(channels, f.name).index_select(0, rows) for f in fields(channels)})


def _write_channels(dst: ChannelTensors, slot: int, src: ChannelTensors) -> None:
    for f in fields(dst):
        getattr(dst, f.name)[slot] = getattr(src, f.name)[0]


class SlotSampling:
    def __init__(self, num_slots: int, n_vq: int, vocab: int, device: torch.device) -> None:
        self.n_vq, self.vocab, self.device = n_vq, vocab, device
        self.state = FrameSampling.build([SamplingParams(seed=0)] * num_slots, n_vq, vocab, device)
        self.ignore_stop = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.frame_index = torch.zeros(num_slots, dtype=torch.long, device=device)  # frames emitted

    def assign(self, slot: int, params: SamplingParams) -> None:
        """Reset a slot for a newly admitted request (nothing of its previous occupant survives)."""
        # Built through FrameSampling.build so the values round exactly as in the reference loop.
        one = FrameSampling.build([params], self.n_vq, self.vocab, self.device)
        _write_channels(self.state.stop, slot, one.stop)
        _write_channels(self.state.audio, slot, one.audio)
        self.state.seed[slot] = one.seed[0]
        self.state.seen[slot] = False
        self.ignore_stop[slot] = params.ignore_stop
        self.frame_index[slot] = 0

    def gather(self, rows: torch.Tensor) -> FrameSampling:
        """FrameSampling of the slots in `rows` [B] (copies: write back with `record`)."""
        s = self.state
        return FrameSampling(stop=_gather_channels(s.stop, rows), audio=_gather_channels(s.audio, rows),
                             seed=s.seed.index_select(0, rows), seen=s.seen.index_select(0, rows))

    def record(self, rows: torch.Tensor, batch: FrameSampling, codes: torch.Tensor,
               emitted: torch.Tensor) -> None:
        """Add this step's emitted codes to the history and advance the frame index of `rows`."""
        batch.record(codes, emitted)
        self.state.seen.index_copy_(0, rows, batch.seen)
        self.frame_index.index_add_(0, rows, emitted.long())
