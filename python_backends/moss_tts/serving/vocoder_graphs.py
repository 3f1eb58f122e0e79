"""VocoderGraphs: CUDA graphs of one streaming vocoder step per (row bucket, frames).

A step is `codec.decode_step(codes, state, rows)`: the rows' ring buffers are read and written
in place in the shared `CodecDecodeState`, so a graph holds no copy of any state, only the
step's activations. VocoderSessions owns that state and the slot bookkeeping; this class owns
only static buffers and graphs, and makes no policy decisions.

Row buckets are powers of two up to 32, then steps of half a power of two (48, 64, 96, 128,
192, 256, ...) and `max_rows` itself, so padding adds less than half from 32 rows on; frames
run 1 .. `max_frames` (the pipeline sends 2 frames, then 10, then the rest; longer chunks come in
pieces of `max_frames`). A call of n rows runs the smallest bucket b >= n: rows n..b-1 point at
the state's scratch row (its last row, never a sequence's slot) with code 0, so padding only ever
touches that row, whose frame counter every step sets back to 0. Every decoder op works row by row, so whatever the scratch row holds cannot
reach a real row's audio (the padding rows race each other on it, harmlessly).

Graphs are captured largest first into one memory pool, so the smaller ones reuse its blocks.
The audio leaves every graph as fp32 in one static buffer, ready for one device-to-host copy.
A step's inputs (rows and codes of every sequence) are written with numpy into one host buffer
(`step_input`) and uploaded with one copy: in the moss_tts process every torch call hands the GIL
over to ~256 stream threads and waits to win it back, so the host path makes a fixed number of
them per step, none per sequence.
Until `capture` runs (never, with capture off) `run` calls the same padded static-buffer
function directly: that is how the padding is tested on the CPU, and a switch for debugging.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..codec.streaming import CodecDecodeState

log = logging.getLogger(__name__)

GIB = 1024 ** 3
REMEDIES = ("Remedies: 1) set the vocoder parameter cuda_graphs=false to serve without graphs; 2) lower "
            "max_step_rows (the largest bucket's activations size the pool) or max_graph_frames if memory ran out.")


class VocoderGraphError(RuntimeError):
    """Warm-up or capture failed; the message lists what to try."""


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


def step_input(slots: list[int], codes: list[np.ndarray], num_rows: int, pad_row: int,
               pinned: bool) -> torch.Tensor:
    """One step's input in the StepInputs.flat layout, int64 [b + b*T*n_vq] with b = num_rows:
    the rows (`slots`, then `pad_row` as padding), then their codes [b, T, n_vq] (the padding's
    are 0). Filled with numpy through one fresh tensor's view, pinned for a copy to a GPU: the
    caching host allocator hands the block out again only once the copy that reads it is done,
    so a round launched while the last one still runs never overwrites its inputs."""
    num_slots, (frames, n_vq) = len(slots), codes[0].shape
    flat = torch.empty(num_rows * (1 + frames * n_vq), dtype=torch.long, pin_memory=pinned)
    host = flat.numpy()
    host[:num_slots] = slots
    host[num_slots:num_rows] = pad_row
    grid = host[num_rows:].reshape(num_rows, frames, n_vq)
    np.stack(codes, out=grid[:num_slots])  # casts int32/int16/uint8 codes to int64
    grid[num_slots:] = 0
    return flat


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


@dataclass
class StepInputs:
    """Static inputs of one (rows, frames) shape. `rows` and `codes` are views of one flat
    buffer, so filling both is a single host-to-device copy."""
    flat: torch.Tensor  # [b + b*T*n_vq] long
    rows: torch.Tensor  # [b]: state rows (slots), padding = the scratch row
    codes: torch.Tensor  # [b, T, n_vq]

    @classmethod
    def empty(cls, num_rows: int, frames: int, n_vq: int, device: torch.device) -> "StepInputs":
        flat = torch.zeros(num_rows * (1 + frames * n_vq), dtype=torch.long, device=device)
        return cls(flat, flat[:num_rows], flat[num_rows:].view(num_rows, frames, n_vq))

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1]

    def copy_from(self, slots: list[int], codes: list[np.ndarray], scratch_row: int, pinned: bool) -> None:
        """slots [n] and codes n x [T, n_vq] (integer numpy arrays); rows n.. go to the scratch
        row. One host buffer, one copy (pinned, non-blocking: the previous replay may still run)."""
        host = step_input(slots, codes, self.rows.shape[0], scratch_row, pinned)
        self.flat.copy_(host, non_blocking=True)


class VocoderGraphs:
    def __init__(self, codec, state: CodecDecodeState, max_rows: int, max_frames: int, n_vq: int):
        """max_rows: the largest bucket (rows per step). The state's last row is the padding's
        scratch row, so it needs more rows than any step uses."""
        if not 1 <= max_rows < state.batch_size:
            raise ValueError(f"max_rows must lie in [1, {state.batch_size - 1}] (the decode state's last row is "
                             f"the padding's scratch row), got {max_rows}")
        self.codec, self.state = codec, state
        self.max_rows = max_rows
        self.scratch_row = state.batch_size - 1
        self.buckets = row_buckets(max_rows)
        self.max_frames = max_frames
        self.device = state.frames.device
        self._is_cuda = self.device.type == "cuda"
        self._inputs = {(b, t): StepInputs.empty(b, t, n_vq, self.device)
                        for b in self.buckets for t in range(1, max_frames + 1)}
        # One fp32 output buffer that every shape writes the front of: one per shape would hold
        # sum(b) x sum(T) frames of audio instead of max(b) x max(T) (79 MB at 256 x 10).
        self._audio = torch.empty(max_rows * codec.channels * max_frames * codec.samples_per_frame,
                                  dtype=torch.float32, device=self.device)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool = self._stream = None

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def can_run(self, num_rows: int, frames: int) -> bool:
        return 1 <= num_rows <= self.max_rows and 1 <= frames <= self.max_frames

    def run(self, slots: list[int], codes: list[np.ndarray]) -> torch.Tensor:
        """One step of the sequences in `slots` (codes n x [T, n_vq], integer numpy arrays) ->
        fp32 audio [n, 2, T*3840] on the device: a view of the static output, valid until the
        next run."""
        frames = codes[0].shape[0]
        shape = (self.buckets[bisect.bisect_left(self.buckets, len(slots))], frames)
        inputs = self._inputs[shape]
        with self._on_device():
            inputs.copy_from(slots, codes, self.scratch_row, self._is_cuda)
            graph = self._graphs.get(shape)
            if graph is None:
                self._forward(inputs)
            else:
                graph.replay()
        return self._output(*shape)[:len(slots)]

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
        log.info("captured %d vocoder graphs (rows %s x frames 1..%d) on %s in %.1f s; pool %.2f GiB reserved, "
                 "%.2f GiB allocated", self.num_graphs, list(self.buckets), self.max_frames, self.device,
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

    def _output(self, num_rows: int, frames: int) -> torch.Tensor:
        size = frames * self.codec.samples_per_frame
        return self._audio[:num_rows * self.codec.channels * size].view(num_rows, self.codec.channels, size)

    def _forward(self, inputs: StepInputs) -> None:
        audio = self.codec.decode_step(inputs.codes, self.state, inputs.rows)
        self._output(*inputs.shape).copy_(audio)  # and to fp32, inside the graph
        # The scratch row restarts every step: left to advance, its stream position would grow
        # for as long as the server runs (bounded work per step, no position past any limit).
        self.state.frames[self.scratch_row:self.scratch_row + 1].zero_()

    def _capture(self, inputs: StepInputs) -> torch.cuda.CUDAGraph:
        # The warm-up really runs, so it must touch the scratch row alone; it sets up cuBLAS
        # workspaces and lazy kernels outside the capture.
        inputs.rows.fill_(self.scratch_row)
        self._forward(inputs)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # torch.cuda.graph empties the allocator's cache on entry, so the warm-up's activations
        # are not held beside the pool's own.
        with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
            self._forward(inputs)
        return graph
