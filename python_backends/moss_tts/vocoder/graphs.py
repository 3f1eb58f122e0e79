"""VocoderGraphs: CUDA graphs of one packed streaming vocoder step per (row bucket, frame bucket).

A step is `codec.decode_step_packed(codes, state, rows, packing)`: the rows bring their next
frames back to back (a round's 2-, 4- and 10-frame chunks in one step; one step per chunk length
paid the codec's ~4.5 ms per-call floor up to ten times a round), and their ring buffers are read
and written in place in the shared `CodecDecodeState`, so a graph holds no copy of any state,
only the step's activations. VocoderSessions owns that state and the slot bookkeeping; this class
owns only static buffers and graphs, and makes no policy decisions.

Row buckets are powers of two up to 32, then steps of half a power of two (48, 64, 96, 128, 192,
256, ...) and the maximum itself (up to `max_rows`), so padding adds less than half from 32 on.
Frame buckets (up to max_rows x `max_frames`) are finer from 64 on, quarter steps (64, 80, 96,
112, 128, 160, ...): a padding frame costs what a real one does in every op but attention, and
the half steps padded a served round of 100-2,560 frames by 17% on average, quarter steps by 9%.
A row brings 1 .. `max_frames` frames (longer chunks come in pieces). A call of n rows and N frames runs the
smallest buckets b >= n and F >= N: rows n..b-1 point at the state's scratch row (its last row,
never a sequence's slot) with 0 frames, so they decode nothing, and frames N..F-1 belong to no
row: computed (every op but attention works frame by frame), never kept, never in a ring. Only
shapes some call can reach are captured (F between b's smallest row count and b x max_frames).

Graphs are captured largest first into one memory pool, so the smaller ones reuse its blocks.
The audio leaves every graph as fp32 [2, F*3840] in one static buffer, ready for one
device-to-host copy. A step's inputs (rows, the packing, the codes) are written with numpy into
one host buffer (`step_input`) and uploaded with one copy: in the moss_tts process every torch
call hands the GIL over to ~256 stream threads and waits to win it back, so the host path makes
a fixed number of them per step, none per sequence.
Until `capture` runs (never, with capture off) `run` calls the same padded static-buffer
function directly: that is how the padding is tested on the CPU, and a switch for debugging.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time

import numpy as np
import torch

from ..codec.streaming import CodecDecodeState
from ..kernels.graph_capture import capture_graph
from .step_buffers import StepInputs

log = logging.getLogger(__name__)

GIB = 1024 ** 3
REMEDIES = ("Remedies: 1) set the vocoder parameter cuda_graphs=false to serve without graphs; 2) lower "
            "max_step_rows (the largest bucket's activations size the pool) or max_graph_frames if memory ran out.")


class VocoderGraphError(RuntimeError):
    """Warm-up or capture failed; the message lists what to try."""


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, .., 32, then 48, 64, 96, 128, 192, .. below max_rows, and max_rows: a call of
    more than 32 rows pads to less than 1.5 times its rows, a smaller one to less than twice."""
    sizes, size = {max_rows}, 1
    while size < max_rows:
        sizes.add(size)
        if size >= 32 and size * 3 // 2 < max_rows:
            sizes.add(size * 3 // 2)
        size *= 2
    return tuple(sorted(sizes))


def frame_buckets(max_frames: int) -> tuple[int, ...]:
    """row_buckets' ladder up to 64, then steps of a quarter power of two (80, 96, 112, 128, 160,
    ...) up to 512, then of an eighth (576, 640, .., 1024, 1152, ...) below max_frames, and
    max_frames: a step of more than 64 frames pads to less than 1.25 times its frames, one of
    more than 512 to less than 1.125. The finer steps where rounds are long: a round's GPU time
    grows with its padded frames, and on an H200 a 256-row round of 1,361 frames took 50.7 ms in
    the 1,536-frame graph (13% padding; 1,408 with eighths). At 256 rows x 10 frames: 157 graphs, not 132."""
    sizes = {size for size in row_buckets(max_frames) if size <= 64} | {max_frames}
    size = 64
    while size < max_frames:
        parts = 4 if size < 512 else 8
        sizes.update(s for s in (size * (parts + i) // parts for i in range(parts)) if s < max_frames)
        size *= 2
    return tuple(sorted(sizes))


def reachable_shapes(row_bucket_sizes: tuple[int, ...], frame_bucket_sizes: tuple[int, ...],
                     max_frames: int) -> list[tuple[int, int]]:
    """The (row bucket, frame bucket) pairs some call can reach: n rows bring n .. n x max_frames
    frames, and the n of bucket b lie between the previous bucket + 1 and b."""
    def bucket(sizes, n):
        return sizes[bisect.bisect_left(sizes, n)]
    shapes, low = [], 1
    for b in row_bucket_sizes:
        first, last = bucket(frame_bucket_sizes, low), bucket(frame_bucket_sizes, b * max_frames)
        shapes += [(b, f) for f in frame_bucket_sizes if first <= f <= last]
        low = b + 1
    return shapes


class VocoderGraphs:
    def __init__(self, codec, state: CodecDecodeState, max_rows: int, max_frames: int, n_vq: int):
        """max_rows: the largest row bucket (rows per step); max_frames: the most frames a row
        brings to a step. The state's last row is the padding's scratch row, so it needs more
        rows than any step uses."""
        if not 1 <= max_rows < state.batch_size:
            raise ValueError(f"max_rows must lie in [1, {state.batch_size - 1}] (the decode state's last row is "
                             f"the padding's scratch row), got {max_rows}")
        self.codec, self.state = codec, state
        self.max_rows = max_rows
        self.scratch_row = state.batch_size - 1
        self.buckets = row_buckets(max_rows)
        self.frame_buckets = frame_buckets(max_rows * max_frames)
        self.max_frames = max_frames
        self.device = state.frames.device
        self._is_cuda = self.device.type == "cuda"
        self._inputs = {(b, f): StepInputs.empty(b, f, n_vq, max_frames, self.device)
                        for b, f in reachable_shapes(self.buckets, self.frame_buckets, max_frames)}
        # One fp32 output buffer that every shape writes the front of: one per shape would hold
        # the audio of every shape's frames instead of the largest's (79 MB at 2,560 frames).
        self._audio = torch.empty(codec.channels * self.frame_buckets[-1] * codec.samples_per_frame,
                                  dtype=torch.float32, device=self.device)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool = self._stream = None

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def can_run(self, num_rows: int, longest: int) -> bool:
        """A step of num_rows rows whose longest brings `longest` frames has a graph."""
        return 1 <= num_rows <= self.max_rows and 1 <= longest <= self.max_frames

    def run(self, slots: list[int], codes: list[np.ndarray]) -> torch.Tensor:
        """One step of the sequences in `slots` (codes n x [T_i, n_vq], integer numpy arrays,
        1 <= T_i <= max_frames) -> fp32 audio [2, sum(T_i)*3840] on the device, row i's after
        the rows before it: a view of the static output, valid until the next run."""
        frames = sum(c.shape[0] for c in codes)
        return self.replay(self.stage(slots, codes))[:, :frames * self.codec.samples_per_frame]

    def stage(self, slots: list[int], codes: list[np.ndarray]) -> tuple[int, int]:
        """run's first half, host work and an asynchronous copy: the step's inputs into the static
        buffers of its (row bucket, frame bucket) shape, which it returns."""
        frames = sum(c.shape[0] for c in codes)
        shape = (self.buckets[bisect.bisect_left(self.buckets, len(slots))],
                 self.frame_buckets[bisect.bisect_left(self.frame_buckets, frames)])
        with self._on_device():
            self._inputs[shape].copy_from(slots, codes, self.scratch_row, self._is_cuda)
        return shape

    def replay(self, shape: tuple[int, int]) -> torch.Tensor:
        """run's second half: the step of the inputs staged for `shape` (its graph, or the same
        ops uncaptured) -> the static output of the shape's frames, padding included. Replaying
        without staging again runs the same codes again, one step further on (benchmarks)."""
        with self._on_device():
            graph = self._graphs.get(shape)
            if graph is None:
                self._forward(self._inputs[shape])
            else:
                graph.replay()
        return self._output(shape[1])

    def capture(self) -> None:
        """Warm up and capture every shape, largest first, into one pool (CUDA only)."""
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the vocoder state is on {self.device}")
        start = time.perf_counter()
        with self._on_device():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            self._pool = torch.cuda.graph_pool_handle()
            # A stream of our own: torch.cuda.graph's default capture stream is one per process,
            # made on whichever device was current at the process's first capture.
            self._stream = torch.cuda.Stream(self.device)
            try:
                for shape in sorted(self._inputs, reverse=True):
                    self._graphs[shape] = self._capture(self._inputs[shape])
            except Exception as exc:
                self.destroy()
                raise VocoderGraphError(f"vocoder CUDA graph capture failed ({exc}). {REMEDIES}") from exc
            torch.cuda.empty_cache()
            # A graph's intermediates are freed back into its private pool once captured, so the
            # pool shows up in reserved memory; allocated grows only by what stays referenced.
            allocated = torch.cuda.memory_allocated() - allocated
            reserved = torch.cuda.memory_reserved() - reserved
        log.info("captured %d packed vocoder graphs (rows %s, frames %s, up to %d a row) on %s in %.1f s; pool "
                 "%.2f GiB reserved, %.2f GiB allocated", self.num_graphs, list(self.buckets),
                 list(self.frame_buckets), self.max_frames, self.device,
                 time.perf_counter() - start, reserved / GIB, allocated / GIB)

    def destroy(self) -> None:
        # NOTE: graphs go before their pool; the pool's memory returns to the caching allocator
        # only once no graph refers to it.
        self._graphs.clear()
        self._pool = self._stream = None
        if self.device.type == "cuda":
            with self._on_device():
                torch.cuda.empty_cache()

    # ---------------------------------------------------------------- internals
    def _on_device(self):
        # Capture and replay on the state's GPU: the process's current device may be another
        # (a vocoder on cuda:1 next to an engine on cuda:0), and a graph's stream and pool
        # belong to the device current at capture.
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _output(self, frames: int) -> torch.Tensor:
        size = frames * self.codec.samples_per_frame
        return self._audio[:self.codec.channels * size].view(self.codec.channels, size)

    def _forward(self, inputs: StepInputs) -> None:
        audio = self.codec.decode_step_packed(inputs.codes, self.state, inputs.rows, inputs.packing)
        self._output(inputs.shape[1]).copy_(audio)  # and to fp32, inside the graph
        # The scratch row restarts every step: left to advance, its stream position would grow
        # for as long as the server runs (bounded work per step, no position past any limit).
        self.state.frames[self.scratch_row:self.scratch_row + 1].zero_()

    def _capture(self, inputs: StepInputs) -> torch.cuda.CUDAGraph:
        # The warm-up really runs, so it must touch the scratch row alone; it sets up cuBLAS
        # workspaces and lazy kernels outside the capture. Every row brings 0 frames: the
        # step's frames are all padding.
        inputs.rows.fill_(self.scratch_row)
        inputs.packing.lengths.zero_()
        inputs.packing.starts.zero_()
        self._forward(inputs)
        torch.cuda.synchronize()
        # torch.cuda.graph empties the allocator's cache on entry, so the warm-up's activations
        # are not held beside the pool's own.
        return capture_graph(lambda: self._forward(inputs), self._pool, self._stream)
