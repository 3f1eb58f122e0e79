"""The two step functions, pure over device state: run eagerly or captured in a CUDA graph.

decode_step: for every slot in [0, S): feed back its last frame through the backbone (one KV row
at its own position), sample the next frame (stop + 12 codebooks), update the slot's state and
write [emitted, codes] to the output rows. prefill_step: for N newly admitted prompts: assign
their slots, run the prompts through the backbone and sample each one's first frame.
Neither reads anything from the host nor syncs with it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..kernels.fused import Fusions
from ..model.sampler import FrameSampling
from ..model.tts_model import MossTTSLocalModel
from . import backbone, frame
from .kv_cache import StaticKVCache
from .slot_state import FLOAT_PARAMS, INT_PARAMS, SlotState

# Prefill attention without cuDNN: cuDNN builds an execution plan for every new (prompts, rows)
# shape, ~0.5 s of host time each (measured on the H200), and batched prefills rarely repeat a
# shape. Graphed and eager prefills use the same backends, so they stay identical.
PREFILL_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class StepContext:
    """Everything the step functions touch, allocated once in ModelRunner.setup."""

    model: MossTTSLocalModel
    cache: StaticKVCache
    state: SlotState
    fusions: Fusions
    rope: frame.LocalRope
    slot_ids: torch.Tensor  # arange(num_slots)
    out: torch.Tensor  # [num_slots (prefill rows) + num_slots (decode rows), 1 + n_vq] int64
    attention_kernel: bool = False  # decode attention by the flash-decoding kernel (GPU)
    sampler_kernel: bool = False  # each draw as one Triton kernel (GPU)
    qkv_kernel: bool = False  # decode layers' q/k norms, RoPE and cache write as one kernel (GPU)
    local_kernel: bool = False  # the local frame's RoPE, cache write and attention as one kernel (GPU)
    prefill_kernel: bool = False  # prefills on the slots in place, prefix copies in one launch (GPU)

    @property
    def decode_offset(self) -> int:
        return self.state.active.shape[0]


class PrefillInputs:
    """Inputs of one batched prefill, all in one flat int64 buffer: pinned on the host for a GPU,
    where a graph keeps a static device copy. One buffer, so a prefill's inputs go up in one
    copy: each torch call on the engine thread gives up the GIL and, under load, waits to win it
    back. The host side fills it through numpy views (`arrays`), which call no torch at all.

    rows [N, T, 13] int64: prompt rows from row `starts`, right-padded with pad rows; slots,
    lengths (prompt rows), starts (rows already in the slot: a reused prefix; 0 without one)
    [N] int64; ints [N, len(INT_PARAMS)] int64; floats [N, len(FLOAT_PARAMS)] float32 (packed
    two to an int64)."""

    def __init__(self, flat: torch.Tensor, num_prompts: int, num_tokens: int, row_width: int) -> None:
        self.flat = flat
        self.shape = (num_prompts, num_tokens)
        self.row_width = row_width

    @staticmethod
    def size(num_prompts: int, num_tokens: int, row_width: int) -> int:
        n = num_prompts
        return n * num_tokens * row_width + 3 * n + n * len(INT_PARAMS) + (n * len(FLOAT_PARAMS) + 1) // 2

    @classmethod
    def empty(cls, num_prompts: int, num_tokens: int, row_width: int, device, pin: bool = False) -> "PrefillInputs":
        flat = torch.zeros(cls.size(num_prompts, num_tokens, row_width), dtype=torch.long, device=device,
                           pin_memory=pin)
        return cls(flat, num_prompts, num_tokens, row_width)

    def _views(self, flat, float_view):
        (n, t), w = self.shape, self.row_width
        ends = np.cumsum([n * t * w, n, n, n, n * len(INT_PARAMS)]).tolist()
        return (flat[:ends[0]].reshape(n, t, w), flat[ends[0]:ends[1]], flat[ends[1]:ends[2]],
                flat[ends[2]:ends[3]], flat[ends[3]:ends[4]].reshape(n, len(INT_PARAMS)),
                float_view(flat[ends[4]:])[:n * len(FLOAT_PARAMS)].reshape(n, len(FLOAT_PARAMS)))

    def arrays(self) -> tuple[np.ndarray, ...]:
        """numpy views (rows, slots, lengths, starts, ints, floats) of a CPU buffer."""
        return self._views(self.flat.numpy(), lambda a: a.view(np.float32))

    @functools.cached_property
    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return self._views(self.flat, lambda t: t.view(torch.float32))

    rows = property(lambda self: self._tensors[0])
    slots = property(lambda self: self._tensors[1])
    lengths = property(lambda self: self._tensors[2])
    starts = property(lambda self: self._tensors[3])
    ints = property(lambda self: self._tensors[4])
    floats = property(lambda self: self._tensors[5])

    def copy_from(self, other: "PrefillInputs") -> None:
        """One non-blocking copy (pinned host -> a graph's static inputs of the same shape)."""
        self.flat.copy_(other.flat, non_blocking=True)

    def to(self, device) -> "PrefillInputs":
        return PrefillInputs(self.flat.to(device, non_blocking=True), *self.shape, self.row_width)


def _sample(ctx: StepContext, hidden, sampling: FrameSampling, frame_index, ignore_stop, active):
    """Sample a frame and record it in the history; emitted = active and not a (heeded) stop."""
    is_stop, codes = frame.sample_frame(ctx.model, ctx.fusions, ctx.rope, hidden, sampling, frame_index,
                                        ctx.sampler_kernel, ctx.local_kernel)
    emitted = active & ~(is_stop & ~ignore_stop)
    sampling.record(codes, emitted)
    return emitted, codes


def _write_out(ctx: StepContext, offset: int, emitted: torch.Tensor, codes: torch.Tensor) -> None:
    ctx.out[offset:offset + codes.shape[0], 0] = emitted.long()
    ctx.out[offset:offset + codes.shape[0], 1:] = codes


def decode_step(ctx: StepContext, num_slots: int, kv_len: int) -> None:
    """One frame for every generating slot in [0, num_slots); output rows decode_offset + slot."""
    model, st, n = ctx.model, ctx.state, num_slots
    active = st.active[:n]
    rows = model.feedback_rows(st.last_codes[:n], active).unsqueeze(1)
    embeds = model.embed_rows(rows).to(model.dtype)
    positions = st.lengths[:n]
    hidden = backbone.decode(model.transformer, ctx.fusions, ctx.cache, embeds, ctx.slot_ids[:n],
                             positions, kv_len, ctx.attention_kernel, ctx.qkv_kernel)
    st.lengths[:n] += active.long()
    frame_index = st.frame_index[:n]
    emitted, codes = _sample(ctx, hidden, st.view(n), frame_index, st.ignore_stop[:n], active)
    frame_index += emitted.long()
    st.active[:n] = emitted & (frame_index < st.max_frames[:n])
    st.last_codes[:n] = torch.where(emitted.unsqueeze(1), codes, st.last_codes[:n])
    _write_out(ctx, ctx.decode_offset, emitted, codes)


def prefill_step(ctx: StepContext, inputs: PrefillInputs, offset: int = 0,
                 hidden: Optional[torch.Tensor] = None, window: int = 0) -> None:
    """Admit N prompts: frame 0 of each to output rows [offset, offset + N). `hidden` [N, H]
    skips the backbone (a long prompt already run chunk by chunk). window > 0: the prompts'
    rows [0, starts) are already in their slots, and attention reads keys [0, window) there."""
    with sdpa_kernel(PREFILL_ATTENTION):
        _prefill(ctx, inputs, offset, hidden, window)


def _prefill(ctx: StepContext, inputs: PrefillInputs, offset: int, hidden: Optional[torch.Tensor],
             window: int) -> None:
    model, st, slots = ctx.model, ctx.state, inputs.slots
    if hidden is None:
        embeds = model.embed_rows(inputs.rows).to(model.dtype)
        if window:
            hidden = backbone.prefill_after(model.transformer, ctx.fusions, ctx.cache, embeds, slots,
                                            inputs.starts, inputs.lengths, window, ctx.prefill_kernel)
        else:
            hidden = backbone.prefill(model.transformer, ctx.fusions, ctx.cache, embeds, slots, inputs.lengths,
                                      ctx.prefill_kernel)
    st.assign(slots, inputs.floats, inputs.ints)
    st.lengths.index_copy_(0, slots, inputs.lengths)
    sampling = st.gather(slots)
    first = torch.zeros_like(slots)
    admitted = torch.ones_like(slots, dtype=torch.bool)
    emitted, codes = _sample(ctx, hidden, sampling, first, st.ignore_stop.index_select(0, slots), admitted)
    st.sampling.seen.index_copy_(0, slots, sampling.seen)
    st.frame_index.index_copy_(0, slots, emitted.long())
    st.active.index_copy_(0, slots, emitted & (emitted.long() < st.max_frames.index_select(0, slots)))
    st.last_codes.index_copy_(0, slots, codes)
    _write_out(ctx, offset, emitted, codes)
