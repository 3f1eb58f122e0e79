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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..uploads import upload_index


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
            cache.index_fill_(1, index, 0)
