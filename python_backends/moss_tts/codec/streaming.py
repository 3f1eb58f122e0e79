"""Explicit streaming-decode state for a batch of independent streams (slots).

One object holds everything that survives between `MossAudioCodec.decode_step` calls:
- `frames` [B]: codec frames already decoded per slot. Every decoder stage derives its RoPE
  offset and ring-buffer positions from it (offset = frames x the stage's upsampling so far),
  so slots can sit at different positions in one batch.
- `caches`: one ring buffer [2, B, heads, context, head_dim] (keys, values) per decoder
  attention layer, in execution order. Position p lives in slot p % context; keys are stored
  rotated (RoPE at their absolute position).

A step reads and writes the rows it decodes where they live (decode_step's `rows`), so the
state is never copied; all updates are in place and the tensors are static CUDA-graph buffers.
A packed step (`Packing`, decode_step_packed) decodes rows of different frame counts at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..kernels.uploads import upload_index


@dataclass
class CodecDecodeState:
    frames: torch.Tensor
    caches: list[torch.Tensor]

    @classmethod
    def empty(cls, batch_size: int, layer_shapes: list[tuple[int, int, int]],
              device: torch.device, dtype: torch.dtype) -> "CodecDecodeState":
        """layer_shapes: (heads, context, head_dim) of every decoder attention layer."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        frames = torch.zeros(batch_size, dtype=torch.long, device=device)
        caches = [torch.zeros(2, batch_size, h, w, d, device=device, dtype=dtype) for h, w, d in layer_shapes]
        return cls(frames, caches)

    @property
    def batch_size(self) -> int:
        return self.frames.shape[0]

    def reset_rows(self, rows: list[int]) -> None:
        """Restart the slots listed (slot reuse); other slots are untouched.

        Zeroing the frame counter already invalidates every cached key; the caches are zeroed
        too so that non-finite values from a previous stream can never leak through 0 * NaN.
        Only the listed rows are written (a rewrite of every row moved the whole state, ~23 GiB at
        289 slots of the real codec, per new stream), with one fill per cache for all of them: a
        fill per decoder layer is ~90 kernel launches, and per new stream they held a vocoder
        round for ~1 ms each."""
        if not rows:
            return
        if min(rows) < 0 or max(rows) >= self.batch_size:
            raise ValueError(f"reset rows must lie in [0, {self.batch_size}), got {rows}")
        index = upload_index(rows, self.frames.device)  # pinned: no wait for the stream's last round
        self.frames.index_fill_(0, index, 0)
        for cache in self.caches:
            _as_words(cache).index_fill_(1, index, 0)


def _as_words(cache: torch.Tensor) -> torch.Tensor:
    """A cache [2, B, ...] as [2, B, n] int64 words where its rows are whole words (the same bytes;
    zero bits are a zero of any dtype), else as [2, B, n] bytes (index_fill_ has no fp8 kernel).
    index_fill_ stores one element a thread: on the H200 a bulk reset of the dirty rows took ~204 µs
    a layer in bf16, 18.8 ms for the 92 layers, in front of a round (issue 34, round 12's soak
    trace). The word view makes each store 8 bytes, not 2; its time on the GPU is not measured yet."""
    if not cache.is_contiguous() or cache.numel() == 0:
        return cache  # index_fill_ along dim 1 as it is (the caches are made contiguous: not reached)
    flat = cache.view(cache.shape[0], cache.shape[1], -1)
    aligned = cache.storage_offset() * cache.element_size() % 8 == 0
    whole_words = aligned and flat.shape[2] * cache.element_size() % 8 == 0
    return flat.view(torch.int64) if whole_words else flat.view(torch.uint8)


@dataclass(frozen=True)
class Packing:
    """Where each row of a packed step (MossAudioCodec.decode_step_packed) keeps its frames in
    the one sequence of N frames: row i owns frames starts[i] .. starts[i] + lengths[i] - 1.
    Frames no row owns are padding (a graph's frame bucket): computed, never kept.
    - starts, lengths [n] long; a row with length 0 (a graph's padding row) decodes nothing;
    - frame_rows, frame_steps [N] long: each frame's row (an index into the step's rows) and its
      index within that row, so every frame finds its stream position on the device (padding
      frames: any row, any step; their positions only feed their own, discarded, outputs);
    - max_frames: the most frames a row may bring (a Python int: it sizes the kernels' grids, so
      a captured graph serves every packing of its shape);
    - positions [N] long: every frame's stream position, set by `at` once the rows' frame
      counters are read (decode_step_packed), for every stage's RoPE table."""
    starts: torch.Tensor
    lengths: torch.Tensor
    frame_rows: torch.Tensor
    frame_steps: torch.Tensor
    max_frames: int
    positions: torch.Tensor | None = None

    @property
    def num_frames(self) -> int:
        return self.frame_rows.shape[0]

    def at(self, frames: torch.Tensor) -> "Packing":
        """This packing with its frames' positions, from the rows' counters `frames` [n]."""
        return replace(self, positions=frames.index_select(0, self.frame_rows) + self.frame_steps)
