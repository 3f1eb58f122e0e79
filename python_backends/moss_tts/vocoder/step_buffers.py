"""A packed codec step's host side. Its inputs (rows, the packing, the codes) are written with numpy
into one flat host buffer (`step_input`) and uploaded with one copy; its audio comes back with one
copy into pinned memory (`to_host`, `PendingAudio`); codes are checked before they get there
(`check_codes`). In the moss_tts process every torch call hands the GIL over to ~256 stream threads
and waits to win it back, so the host path makes a fixed number of them per step, none per sequence.
No Triton import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Optional

import numpy as np
import torch

from ..codec.streaming import Packing


def to_host(audio: torch.Tensor, wait: bool = True) -> torch.Tensor:
    """A new fp32 CPU tensor holding `audio` (a step's output). From a GPU: into pinned memory
    (the caching host allocator reuses it once its views are gone and its copy is done), waiting
    for this stream alone; wait=False only enqueues the copy (the caller waits for an event it
    records after it). Either way the next replay, later on the same stream, cannot overwrite
    the graph's output before the copy read it."""
    if audio.device.type != "cuda":
        return audio.to("cpu", torch.float32, copy=True)  # copy=True: never the graphs' own buffer
    host = torch.empty(audio.shape, dtype=torch.float32, pin_memory=True)
    host.copy_(audio, non_blocking=True)
    if wait:
        torch.cuda.current_stream(audio.device).synchronize()
    return host


def sections(num_rows: int, num_frames: int) -> tuple[slice, ...]:
    """Where a packed step's flat int64 input keeps each part, for b = num_rows, F = num_frames:
    rows [b], starts [b], lengths [b], frame_rows [F], frame_steps [F], codes [F*n_vq]."""
    b, f = num_rows, num_frames
    bounds = (0, b, 2 * b, 3 * b, 3 * b + f, 3 * b + 2 * f)
    return (*(slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])), slice(bounds[-1], None))


def step_input(slots: list[int], codes: list[np.ndarray], num_rows: int, num_frames: int, pad_row: int,
               pinned: bool) -> torch.Tensor:
    """One packed step's input in the StepInputs.flat layout, int64 [3b + 2F + F*n_vq] with
    b = num_rows, F = num_frames: rows (`slots`, then `pad_row` as padding), starts, lengths (the
    padding rows': 0), frame_rows, frame_steps (padding frames: row 0, step 0), then the codes
    [F, n_vq] (the padding's are 0). Filled with numpy through one fresh tensor's view, pinned
    for a copy to a GPU: the caching host allocator hands the block out again only once the copy
    that reads it is done, so a round launched while the last one still runs never overwrites
    its inputs."""
    num_slots, n_vq = len(slots), codes[0].shape[1]
    b, f = num_rows, num_frames
    flat = torch.empty(3 * b + 2 * f + f * n_vq, dtype=torch.long, pin_memory=pinned)
    host = flat.numpy()
    rows, starts, lengths, frame_rows, frame_steps, grid = (host[part] for part in sections(b, f))
    rows[:num_slots] = slots
    rows[num_slots:] = pad_row
    counts = np.fromiter((c.shape[0] for c in codes), dtype=np.int64, count=num_slots)
    used = int(counts.sum())
    lengths[:num_slots] = counts
    lengths[num_slots:] = 0
    np.cumsum(counts, out=starts[:num_slots])
    starts[:num_slots] -= counts
    starts[num_slots:] = used
    frame_rows[:used] = np.repeat(np.arange(num_slots), counts)
    frame_rows[used:] = 0
    frame_steps[:used] = np.arange(used) - np.repeat(starts[:num_slots], counts)
    frame_steps[used:] = 0
    grid = grid.reshape(f, n_vq)
    np.concatenate(codes, out=grid[:used], casting="unsafe")  # int32/int16/uint8 codes to int64
    grid[used:] = 0
    return flat


@dataclass
class StepInputs:
    """Static inputs of one (rows, frames) shape, all views of one flat buffer, so filling them
    is a single host-to-device copy (layout: step_input)."""
    flat: torch.Tensor  # [3b + 2F + F*n_vq] long
    rows: torch.Tensor  # [b]: state rows (slots), padding = the scratch row
    packing: Packing
    codes: torch.Tensor  # [F, n_vq]

    @classmethod
    def empty(cls, num_rows: int, num_frames: int, n_vq: int, max_frames: int, device: torch.device) -> "StepInputs":
        flat = torch.zeros(num_rows * 3 + num_frames * (2 + n_vq), dtype=torch.long, device=device)
        return cls.of(flat, num_rows, num_frames, max_frames)

    @classmethod
    def of(cls, flat: torch.Tensor, num_rows: int, num_frames: int, max_frames: int) -> "StepInputs":
        """Views of a flat buffer laid out as step_input writes it."""
        rows, starts, lengths, frame_rows, frame_steps, codes = (flat[part] for part in sections(num_rows, num_frames))
        return cls(flat, rows, Packing(starts, lengths, frame_rows, frame_steps, max_frames),
                   codes.view(num_frames, -1))

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows.shape[0], self.codes.shape[0]

    def copy_from(self, slots: list[int], codes: list[np.ndarray], scratch_row: int, pinned: bool) -> None:
        """slots [n] and codes n x [T_i, n_vq] (integer numpy arrays); rows n.. go to the scratch
        row. One host buffer, one copy (pinned, non-blocking: the previous replay may still run)."""
        host = step_input(slots, codes, *self.shape, scratch_row, pinned)
        self.flat.copy_(host, non_blocking=True)


INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)  # codes as torch tensors
HOST_INTEGER_DTYPES = tuple(np.dtype(d) for d in (np.int64, np.int32, np.int16, np.uint8))  # the same, in numpy


@dataclass
class PendingAudio:
    """The audio of one decode call on its way to host memory: wait() -> {seq_id: [2, S] fp32
    numpy}, each a view of (or joined from) its steps' fresh host tensors, which no later call
    writes. Not to be read before wait(): the copies may still be on their way."""

    parts: dict[Hashable, list[np.ndarray]]  # per sequence, its steps' audio in order
    ready: Optional["torch.cuda.Event"] = None  # recorded after the last copy; None: copied already

    def wait(self) -> dict[Hashable, np.ndarray]:
        if self.ready is not None:
            self.ready.synchronize()
        return {sid: p[0] if len(p) == 1 else np.concatenate(p, axis=-1) if p else np.zeros((2, 0), np.float32)
                for sid, p in self.parts.items()}


def check_codes(seq_id: Hashable, codes, n_vq: int, size: int) -> np.ndarray:
    """`codes` (numpy, or a torch tensor converted once) as a numpy array if they are one chunk
    [T, n_vq] of codes in [0, size), else ValueError naming `seq_id`. Numpy alone for an array:
    the worker's stream threads call this per chunk (no GIL hand-off)."""
    if isinstance(codes, torch.Tensor) and codes.dtype in INTEGER_DTYPES:
        codes = codes.cpu().numpy()
    if not isinstance(codes, np.ndarray) or codes.dtype not in HOST_INTEGER_DTYPES:
        raise ValueError(f"sequence {seq_id!r}: codes must be an integer tensor [T, {n_vq}]")
    if codes.ndim != 2 or codes.shape[1] != n_vq:
        raise ValueError(f"sequence {seq_id!r}: codes must have shape [T, {n_vq}], got {tuple(codes.shape)}")
    # Checked here because decode_step cannot: an out-of-range code on CUDA is a device-side
    # assert that poisons the whole context, not just this request.
    if codes.size and (codes.min() < 0 or codes.max() >= size):
        raise ValueError(f"sequence {seq_id!r}: codes must lie in [0, {size})")
    return codes
