"""The codec's weights pulled into L2 one GEMM ahead, at steps of few tokens (issue 34, round 21).

A 1-row x 2-frame step puts 2-64 tokens through each of the decoder's layers, and each layer's four
cuBLAS GEMMs read 3-13 MB of weights each at ~0.5-1.2 TB/s: too short to get the loads in
flight. Here a side CUDA stream asks for the weights of the GEMM after next while the current one
runs (kernels/l2_prefetch.py), so that GEMM reads L2. At three points of a layer's forward:

  0  the layer's start: out_proj and ffn[0] (in_proj reads what point 2 of the layer before asked for);
  1  before the ffn's norm: ffn[2];
  2  before ffn[2]: the next layer's in_proj.

So at most ~26 MB are wanted at once (the GEMM running and the next one's), half the H100's and
H200's 50 MB L2. Each point first makes the side stream wait for the main stream, so a prefetch starts
no earlier than the GEMM before the one it serves. The stage joins the side stream back before it
returns (CUDA graph capture needs every forked stream joined; eager runs it as the same order).
Prefetches only ask for bytes; they write nothing and the results are bit for bit the same.

Off unless asked (`MossAudioCodec.l2_prefetch_`, perf/bench_vocoder.py --l2-prefetch-rows): not
yet measured on a GPU, so no serving parameter exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..kernels import l2_prefetch

if TYPE_CHECKING:
    from .transformer import TransformerLayer

cuda = torch.cuda  # the stream calls, by this name so that the CPU tests swap in fakes for this module only
MAX_ROWS = 256  # most tokens a stage's step may have to prefetch for; above, the GEMMs are compute-bound


class SideStream:
    """A stage's side stream, and whether it forked from the main stream since its last join: a
    join with no fork before it would wait, inside a graph capture, on work outside the capture
    (a stage whose steps took the small-GEMM path issues nothing, yet ends the same way)."""

    def __init__(self, stream: "torch.cuda.Stream"):
        self.stream = stream
        self.forked = False

    def fork(self) -> None:
        self.stream.wait_stream(cuda.current_stream(self.stream.device))
        self.forked = True

    def join(self) -> None:
        if self.forked:
            cuda.current_stream(self.stream.device).wait_stream(self.stream)
            self.forked = False


class LayerPrefetch:
    """One layer's three prefetch points (module docstring) on its stage's SideStream."""

    def __init__(self, rows: int, side: SideStream, points: tuple[tuple[torch.Tensor, ...], ...]):
        self.rows = rows
        self.side = side
        self.points = points

    def applies(self, x: torch.Tensor) -> bool:
        """True for a step of at most `rows` tokens (x [..., d]: a graph's static shape)."""
        return x.numel() <= self.rows * x.shape[-1]

    def issue(self, point: int) -> None:
        weights = self.points[point]
        if not weights:
            return
        self.side.fork()  # no earlier than the main stream's work so far
        with cuda.stream(self.side.stream):
            for weight in weights:
                l2_prefetch.prefetch(weight)

    def join(self) -> None:
        """The main stream waits for the side stream, if it forked (the stage's end)."""
        self.side.join()


def attach(layers: list["TransformerLayer"], rows: int) -> int:
    """Give each of a stage's layers (in the order they run) its LayerPrefetch for steps of at
    most `rows` tokens; 0 detaches. Where no bulk prefetch can run (CPU, before sm_90) nothing
    changes. Returns the rows that run."""
    if not 0 <= rows <= MAX_ROWS:
        raise ValueError(f"l2_prefetch_rows must be in [0, {MAX_ROWS}], got {rows}")
    weights = [w for layer in layers for w in _gemm_weights(layer)]
    if rows == 0 or not weights or not all(l2_prefetch.is_supported(w) for w in weights):
        for layer in layers:
            layer.prefetch = None
        return 0
    # the highest priority: a prefetch that comes late is worth nothing, and its few programs
    # take almost no SM time from the stream they serve (eager runs; a graph's replay keeps none)
    side = SideStream(cuda.Stream(weights[0].device, priority=-1))
    for i, layer in enumerate(layers):
        _, out_proj, up, down = weights[4 * i: 4 * i + 4]
        following = (weights[4 * i + 4],) if i + 1 < len(layers) else ()  # the next layer's in_proj
        layer.prefetch = LayerPrefetch(rows, side, ((out_proj, up), (down,), following))
    return rows


def _gemm_weights(layer: "TransformerLayer") -> tuple[torch.Tensor, ...]:
    """in_proj, out_proj, ffn[0], ffn[2]: the layer's GEMM weights in the order they run."""
    attn, ffn = layer.self_attn, layer.ffn
    return attn.in_proj.weight, attn.out_proj.weight, ffn[0].weight, ffn[2].weight
