"""How a step's newly admitted prompts are prefilled: each staged with its slot and parameters,
grouped longest first into launches of bounded padded rows (`prefill_plan`), and one launch's
inputs written into one pinned buffer (`prefill_inputs`). Host-side policy of the runner, no
device work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..contract.sampling_params import SamplingParams
from ..model.config import MossTTSConfig
from .prefix_cache import PrefixMatch
from .slot_state import param_rows
from .step import PrefillInputs


# The parameters of a padding prompt (a batched prefill's rows past its group, in the scratch slot).
_PAD_PARAMS = param_rows(SamplingParams(seed=0, max_frames=1))


@dataclass(frozen=True)
class StagedPrompt:
    slot: int
    rows: torch.Tensor  # [T, 13] int64, CPU
    params: SamplingParams
    prefix: Optional[PrefixMatch] = None  # None with prefix reuse off
    param_rows: Optional[tuple[list[float], list[int]]] = None  # param_rows(params), if known

    @property
    def start(self) -> int:
        """Rows copied from the prefix pool rather than prefilled."""
        return 0 if self.prefix is None else self.prefix.reused_rows


def prefill_plan(staged: list[StagedPrompt], chunk_tokens: int):
    """Output order of the prompts, and (first output row, prompts) per prefill launch.

    A launch pads its prompts to its longest, so the prompts are grouped longest first into
    launches of at most chunk_tokens padded rows; a prompt longer than that runs alone, chunk by
    chunk. Few launches, because an eager prefill costs ~100 ms of host time however few its rows
    (on the H200), and bounded ones, so a clone's long prompt does not pad fifty short ones to its
    length."""
    groups: list[list[StagedPrompt]] = []
    for prompt in sorted(staged, key=lambda p: p.rows.shape[0] - p.start, reverse=True):
        if groups:
            longest = groups[-1][0].rows.shape[0] - groups[-1][0].start
            if longest <= chunk_tokens and (len(groups[-1]) + 1) * longest <= chunk_tokens:
                groups[-1].append(prompt)
                continue
        groups.append([prompt])
    # The shortest prompts' launch first: it is the one a batched-prefill graph can replay,
    # and a graph writes its output rows from row 0.
    groups.reverse()
    offsets = [sum(len(g) for g in groups[:i]) for i in range(len(groups))]
    return [p for g in groups for p in g], list(zip(offsets, groups))


def prefill_inputs(group: list[StagedPrompt], num_prompts: int, num_tokens: int, cfg: MossTTSConfig,
                   scratch_slot: int, pin: bool) -> PrefillInputs:
    """Right-padded prompt rows and parameters, pinned for an asynchronous upload; prompts
    past the group's (padding to num_prompts) are one pad row each in `scratch_slot`.

    One pinned buffer filled through numpy views, not tensor by tensor: each torch call on
    this thread gives up the GIL and must win it back, which costs up to the switch interval
    whenever stream threads are busy (under a mixed load, ~8 calls a prompt made the
    engine's host time per step several times its GPU time)."""
    host = PrefillInputs.empty(num_prompts, num_tokens, cfg.row_width, "cpu", pin=pin)
    rows, slots, lengths, starts, ints, floats = host.arrays()
    rows[..., 0] = cfg.pad_token_id
    rows[..., 1:] = cfg.audio_pad_code
    slots[len(group):], lengths[len(group):] = scratch_slot, 1
    for i, p in enumerate(group):
        t = min(p.rows.shape[0] - p.start, num_tokens)
        rows[i, :t] = p.rows.numpy()[p.start:p.start + t]
        slots[i], lengths[i], starts[i] = p.slot, p.rows.shape[0], p.start
    params = ([param_rows(p.params) if p.param_rows is None else p.param_rows for p in group]
              + [_PAD_PARAMS] * (num_prompts - len(group)))
    floats[:] = np.array([f for f, _ in params], dtype=np.float32)
    ints[:] = np.array([i for _, i in params], dtype=np.int64)
    return host
