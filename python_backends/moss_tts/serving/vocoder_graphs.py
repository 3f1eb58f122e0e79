"""VocoderGraphs: CUDA graphs of one streaming vocoder step per (row bucket, frames).

A step is gather -> decode_step -> scatter on the shared `CodecDecodeState` (decode_rows).
VocoderSessions owns that state and the slot bookkeeping; this class owns only static buffers
and graphs, and makes no policy decisions.

Row buckets are the powers of two up to `max_rows` plus `max_rows` itself; frames run 1 ..
`max_frames` (the pipeline sends 2 frames, then 10, then the rest). A call of n rows runs the
smallest bucket b >= n: rows n..b-1 point at the state's scratch row (its last row, never a
sequence's slot) with code 0, so padding only ever advances that row. Every decoder op works row
by row, so whatever the scratch row holds cannot reach a real row's audio.

Graphs are captured largest first into one memory pool, so the smaller ones reuse its blocks.
The pool is mostly the largest shape's gathered copy of max_rows slots: on the real-size codec
26 GiB at 256 rows beside a 21 GiB state (perf/bench_vocoder.py), where graphs no longer gain
anything (the step is compute-bound from ~64 rows on), hence VocoderConfig.max_step_rows.
Until `capture` runs (never, with capture off) `run` calls the same padded static-buffer
function directly: that is how the padding is tested on the CPU, and a switch for debugging.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from dataclasses import dataclass

import torch

from ..codec.streaming import CodecDecodeState

log = logging.getLogger(__name__)

GIB = 1024 ** 3
REMEDIES = ("Remedies: 1) set the vocoder parameter cuda_graphs=false to serve without graphs; 2) lower "
            "max_step_rows (the largest bucket gathers that many slots of codec state) or max_graph_frames "
            "if memory ran out.")


class VocoderGraphError(RuntimeError):
    """Warm-up or capture failed; the message lists what to try."""


def decode_rows(codec, state: CodecDecodeState, rows: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """One streaming step of the slots `rows` [n] alone: codes [n, T, n_vq] -> audio [n, 2, T*3840].
    Works on a compact copy of those rows, so the other slots' state stays untouched."""
    part = state.gather(rows)
    audio = codec.decode_step(codes, part)
    state.scatter(rows, part)
    return audio


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, ... below max_rows, and max_rows: a call pads at most to twice its rows."""
    sizes, size = {max_rows}, 1
    while size < max_rows:
        sizes.add(size)
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

    def copy_from(self, slots: list[int], codes: list[torch.Tensor], scratch_row: int) -> None:
        """slots [n] and codes n x [T, n_vq] long on the CPU; rows n.. go to the scratch row."""
        num_rows, frames, n_vq = self.codes.shape
        pad = num_rows - len(slots)
        host = torch.cat([torch.tensor(slots + [scratch_row] * pad, dtype=torch.long),
                          *(c.reshape(-1) for c in codes), torch.zeros(pad * frames * n_vq, dtype=torch.long)])
        self.flat.copy_(host)


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
        self._inputs = {(b, t): StepInputs.empty(b, t, n_vq, self.device)
                        for b in self.buckets for t in range(1, max_frames + 1)}
        # One output buffer that every shape writes the front of: one per shape would hold
        # sum(b) x sum(T) frames of audio (~0.7 GB at 288 rows in bf16) instead of max(b) x max(T).
        dtype = next(codec.decoder.parameters()).dtype
        self._audio = torch.empty(max_rows * codec.channels * max_frames * codec.samples_per_frame,
                                  dtype=dtype, device=self.device)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool = self._stream = None

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def can_run(self, num_rows: int, frames: int) -> bool:
        return 1 <= num_rows <= self.max_rows and 1 <= frames <= self.max_frames

    def run(self, slots: list[int], codes: list[torch.Tensor]) -> torch.Tensor:
        """One step of the sequences in `slots` (codes n x [T, n_vq] long on the CPU) ->
        audio [n, 2, T*3840] on the device: a view of the static output, valid until the next run."""
        frames = codes[0].shape[0]
        shape = (self.buckets[bisect.bisect_left(self.buckets, len(slots))], frames)
        inputs = self._inputs[shape]
        with self._on_device():
            inputs.copy_from(slots, codes, self.scratch_row)
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
        audio = decode_rows(self.codec, self.state, inputs.rows, inputs.codes)
        self._output(*inputs.shape).copy_(audio)

    def _capture(self, inputs: StepInputs) -> torch.cuda.CUDAGraph:
        # The warm-up really runs, so it must touch the scratch row alone; it sets up cuBLAS
        # workspaces and lazy kernels outside the capture.
        inputs.rows.fill_(self.scratch_row)
        self._forward(inputs)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # torch.cuda.graph empties the allocator's cache on entry, so the warm-up's blocks (the
        # gathered state of up to max_rows slots) are not held beside the pool's own copy.
        with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
            self._forward(inputs)
        return graph
