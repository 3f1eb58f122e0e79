"""VocoderSessions: streaming codec decode of many sequences through one batched decoder state.

One `CodecDecodeState` of `max_slots` + 1 rows is allocated once. A sequence owns one row (slot)
from `start` until `end`, `cancel`, `expire` (the sequence batcher's idle timeout) or a failed
decode; the row is zeroed before it is handed out again. `decode` runs one packed step
(`decode_step_packed`: chunks of any lengths back to back) per `max_step_rows` rows, in place:
other rows' ring buffers and frame counters stay untouched; the cost follows the streams with work.

Chunks longer than `max_graph_frames` (a STREAM=false request, a primed reference) are decoded in
pieces of that many frames, piece k of every chunk of the call in step k. With `cuda_graphs` every
step replays a CUDA graph (VocoderGraphs): no shape runs eagerly and the GPU memory is fixed once
they are captured. The state's extra row (beyond `max_slots`) is the graphs' padding row. Sessions
started without the pipeline's key (direct gRPC clients) share `max_public_sessions` slots.

Host bookkeeping is numpy (one host buffer of inputs a step, audio as views): in moss_tts each torch
call gives the GIL up to ~256 stream threads, so a call makes a fixed few per step, none per
sequence (slots are reset many at once). `decode` and `check` also take torch tensors.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np
import torch

from ..kernels.uploads import to_device
from .config import NoFreeSlot, VocoderConfig
from .graphs import GIB, VocoderGraphs
from .step_buffers import PendingAudio, StepInputs, check_codes, step_input, to_host

log = logging.getLogger(__name__)

Codes = np.ndarray | torch.Tensor  # a chunk [T, n_vq] of integer codes


@dataclass(frozen=True)
class VocoderStats:
    active_slots: int
    free_slots: int
    sessions_started: int
    sessions_ended: int
    sessions_cancelled: int
    sessions_expired: int
    sessions_failed: int  # ended by an error inside decode_step
    decode_calls: int  # decode_step calls (primes included)
    frames_decoded: int
    graph_calls: int  # of decode_calls, those run by VocoderGraphs (the rest ran eagerly)


@dataclass
class _Session:
    slot: int
    last_used: float  # clock() at start or at the last decode/prime
    is_public: bool = False


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class VocoderSessions:
    """Thread-safe; sequence ids are any hashable (Triton CORRID: uint64 or string)."""

    def __init__(self, codec, config: VocoderConfig, clock: Callable[[], float] = time.monotonic,
                 capture: bool = True):
        """capture=False runs the graphs' padded static-buffer step without capturing it (when
        config.cuda_graphs is on): CPU tests of the padding, or debugging a capture problem."""
        if config.n_vq > codec.num_quantizers:
            raise ValueError(f"VocoderConfig.n_vq={config.n_vq} exceeds the codec's {codec.num_quantizers} quantizers")
        p = next(codec.decoder.parameters())
        if p.dtype != config.torch_dtype or not _same_device(p.device, config.torch_device):
            raise ValueError(f"VocoderConfig wants {config.dtype} on {config.device} but the codec decoder is "
                             f"{p.dtype} on {p.device}; load the codec with the same device and dtype")
        self.codec = codec
        self.config = config
        self._clock = clock
        # Row max_slots is the graphs' scratch row (padding); it is never a free slot.
        self.state = codec.new_decode_state(config.max_slots + 1, config.torch_device, config.torch_dtype)
        self._device = self.state.frames.device
        self.step_rows = min(config.max_step_rows, config.max_slots)
        self.graphs = self._graphs(capture)
        self._sessions: dict[Hashable, _Session] = {}
        # A heap of clean slots (the lowest first); released ones stay dirty until the clean ones run
        # out (start_many). All are zeroed here, done before any stream uses them: capture wrote some.
        self._free, self._dirty = list(range(config.max_slots)), []
        self.state.reset_rows(self._free)
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        self._lock = threading.Lock()
        self._started = self._ended = self._cancelled = self._expired = self._failed = 0
        self._decode_calls = self._frames_decoded = self._graph_calls = 0

    def _graphs(self, capture: bool) -> VocoderGraphs | None:
        if not self.config.cuda_graphs:
            return None
        if capture and self.config.torch_device.type != "cuda":
            # Ignored rather than refused, so the shipped config.pbtxt (cuda_graphs=true) also
            # loads on CPU development machines.
            log.info("vocoder cuda_graphs=true ignored: the vocoder runs on %s", self.config.device)
            return None
        graphs = VocoderGraphs(self.codec, self.state, self.step_rows, self.config.max_graph_frames,
                               self.config.n_vq)
        if capture:
            graphs.capture()
            state_bytes = sum(c.numel() * c.element_size() for c in self.state.caches)
            log.info("vocoder memory on %s: state %.2f GiB (%d slots + scratch), %.2f GiB allocated and %.2f GiB "
                     "reserved in all; fixed from here on (every step replays a graph)", self.config.device,
                     state_bytes / GIB, self.config.max_slots, torch.cuda.memory_allocated(self.config.device) / GIB,
                     torch.cuda.memory_reserved(self.config.device) / GIB)
        return graphs

    # ---------------------------------------------------------------- lifecycle
    def start(self, seq_id: Hashable, is_public: bool = False) -> int:
        """Give `seq_id` a fresh slot and return its index."""
        result = self.start_many([seq_id], is_public)[seq_id]
        if isinstance(result, NoFreeSlot):
            raise result
        return result

    def start_many(self, seq_ids: list[Hashable], is_public: bool = False) -> dict[Hashable, "int | NoFreeSlot"]:
        """Give each of `seq_ids` a zeroed slot: {seq: slot, or the NoFreeSlot that refused it}; an
        active sequence is a ValueError (nothing starts). Short of clean slots, all released ones are
        reset at once: a reset is a torch call (a GIL hand-off) per decoder layer, issue 34."""
        with self._lock:
            for seq_id in seq_ids:
                if seq_id in self._sessions:
                    raise ValueError(f"sequence {seq_id!r} is already active; end or cancel it before starting it again")
            if len(self._free) < len(seq_ids) and self._dirty:
                self.state.reset_rows(self._dirty)  # on this thread's stream, before their decodes
                self._free, self._dirty = sorted(self._free + self._dirty), []  # a sorted list is a heap
            results: dict[Hashable, int | NoFreeSlot] = {}
            num_public = sum(s.is_public for s in self._sessions.values())
            for seq_id in seq_ids:
                if not self._free:
                    results[seq_id] = NoFreeSlot(f"all {self.config.max_slots} vocoder slots hold active sequences; "
                                                 "retry later or raise max_slots")
                elif is_public and num_public >= self.config.max_public_sessions:
                    results[seq_id] = NoFreeSlot(
                        f"{num_public} sequences of direct callers are active, the limit for callers other than the "
                        "moss_tts entry (max_public_sessions); retry later")
                else:
                    slot = heapq.heappop(self._free)
                    self._sessions[seq_id] = _Session(slot, self._clock(), is_public)
                    self._started += 1
                    num_public += is_public
                    results[seq_id] = slot
            return results

    def end(self, seq_id: Hashable) -> None:
        with self._lock:
            self._release(seq_id)
            self._ended += 1

    def cancel(self, seq_id: Hashable) -> None:
        with self._lock:
            self._release(seq_id)
            self._cancelled += 1

    def expire(self, idle_seconds: float, now: float | None = None) -> list[Hashable]:
        """End every sequence idle for more than `idle_seconds`; returns their ids."""
        if idle_seconds < 0:
            raise ValueError(f"idle_seconds must be >= 0, got {idle_seconds}")
        with self._lock:
            now = self._clock() if now is None else now
            stale = [sid for sid, s in self._sessions.items() if now - s.last_used > idle_seconds]
            for sid in stale:
                self._release(sid)
            self._expired += len(stale)
            return stale

    def __contains__(self, seq_id: Hashable) -> bool:
        with self._lock:
            return seq_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)  # open sequences (one dict length: no lock needed)

    # ---------------------------------------------------------------- decode
    def decode(self, chunks: dict[Hashable, Codes], checked: bool = False) -> dict[Hashable, torch.Tensor]:
        """Next frames of several sequences: {seq_id: codes [T_i, n_vq]} -> {seq_id: [2, T_i*3840] fp32 CPU}.
        checked: the caller has validated every chunk (integer, [T, n_vq], in range) already."""
        return {sid: torch.from_numpy(audio) for sid, audio in self.decode_async(chunks, checked).wait().items()}

    def decode_async(self, chunks: dict[Hashable, Codes], checked: bool = False) -> "PendingAudio":
        """decode() without waiting for the device: the steps and their copies to host memory are
        enqueued on the current stream, and the result's wait() returns the audio (numpy). The
        state has advanced already, so the next call may follow at once (it runs after these
        steps). With numpy chunks the torch calls are a fixed few per step (module docstring)."""
        return self._run(chunks, keep_audio=True, checked=checked)

    def prime(self, seq_id: Hashable, codes: Codes) -> None:
        """Decode and discard (continuation mode feeds the reference frames first)."""
        self._run({seq_id: codes}, keep_audio=False)

    def stats(self) -> VocoderStats:
        with self._lock:
            active = len(self._sessions)
            return VocoderStats(active, self.config.max_slots - active, self._started, self._ended,
                                self._cancelled, self._expired, self._failed, self._decode_calls,
                                self._frames_decoded, self._graph_calls)

    # ---------------------------------------------------------------- internals
    def _session(self, seq_id: Hashable) -> _Session:
        session = self._sessions.get(seq_id)
        if session is None:
            raise KeyError(f"unknown vocoder sequence {seq_id!r}: never started, or already ended, "
                           "cancelled or expired; start it first")
        return session

    def _release(self, seq_id: Hashable) -> None:
        self._dirty.append(self._session(seq_id).slot)  # reset before it is handed out again
        del self._sessions[seq_id]

    def check(self, seq_id: Hashable, codes: Codes) -> np.ndarray:
        """`codes` (numpy, or a torch tensor converted once) as a numpy array if they are one
        chunk this vocoder can decode, else ValueError naming `seq_id` (step_buffers.check_codes)."""
        return check_codes(seq_id, codes, self.config.n_vq, self.codec.codebook_size)

    def _host_codes(self, chunks: dict[Hashable, Codes], checked: bool) -> dict[Hashable, np.ndarray]:
        """The chunks as numpy arrays (a torch tensor converted once), checked unless the caller did."""
        if not checked:
            return {sid: self.check(sid, c) for sid, c in chunks.items()}
        return {sid: c if isinstance(c, np.ndarray) else c.cpu().numpy() for sid, c in chunks.items()}

    def _pieces(self, frames: int) -> list[tuple[int, int]]:
        """A chunk's frames as the (start, frames) of the steps that decode it: pieces of
        max_graph_frames (with or without graphs: a step's activations stay bounded)."""
        limit = self.config.max_graph_frames
        return [(start, min(limit, frames - start)) for start in range(0, frames, limit)]

    def _run(self, chunks: dict[Hashable, Codes], keep_audio: bool, checked: bool = False) -> "PendingAudio":
        with self._lock:
            # Validate everything first so a bad chunk leaves every sequence's state untouched.
            slots = {sid: self._session(sid).slot for sid in chunks}
            codes = self._host_codes(chunks, checked)
            pieces = {sid: self._pieces(c.shape[0]) for sid, c in codes.items()}
            parts: dict[Hashable, list[np.ndarray]] = {sid: [] for sid in codes}
            try:
                # Step k decodes piece k of every chunk that has one, whatever its length.
                for k in range(max((len(p) for p in pieces.values()), default=0)):
                    piece = {sid: codes[sid][steps[k][0]:steps[k][0] + steps[k][1]]
                             for sid, steps in pieces.items() if k < len(steps)}
                    for sid, audio in self._step(list(piece), slots, piece, keep_audio).items():
                        parts[sid].append(audio)
                ready = None
                if keep_audio and self._device.type == "cuda":  # the copies' end
                    ready = torch.cuda.Event(blocking=True)  # the worker sleeps on it (runner.py says why)
                    ready.record(torch.cuda.current_stream(self._device))
            except BaseException:
                # Earlier steps advanced their state but their audio never reaches the caller,
                # so no sequence of this call can continue without a gap: end them all.
                for sid in slots:
                    self._release(sid)
                self._failed += len(slots)
                raise
            now = self._clock()
            for sid in slots:
                self._sessions[sid].last_used = now
            return PendingAudio(parts if keep_audio else {}, ready)

    def _step(self, ids: list[Hashable], slots: dict[Hashable, int], codes: dict[Hashable, np.ndarray],
              keep_audio: bool) -> dict[Hashable, np.ndarray]:
        """Decode the sequences in `ids` (each bringing 1..max_graph_frames frames), step_rows
        at a time, each group in one packed step."""
        out = {}
        for first in range(0, len(ids), self.step_rows):
            piece = ids[first:first + self.step_rows]
            rows = [slots[sid] for sid in piece]
            host = [codes[sid] for sid in piece]
            lengths = [c.shape[0] for c in host]
            if self.graphs is not None and self.graphs.can_run(len(piece), max(lengths)):
                audio = self.graphs.run(rows, host)
                self._graph_calls += 1
            else:
                audio = self._eager_step(rows, host)
            self._decode_calls += 1
            self._frames_decoded += sum(lengths)
            if keep_audio:
                # The step's one device-to-host copy, before the next replay overwrites a graph's
                # static output; each row's audio is a numpy view of one fresh host tensor.
                host_audio, spf, start = to_host(audio, wait=False).numpy(), self.codec.samples_per_frame, 0
                for sid, n in zip(piece, lengths):
                    out[sid] = host_audio[:, start * spf:(start + n) * spf]
                    start += n
        return out

    def _eager_step(self, rows: list[int], codes: list[np.ndarray]) -> torch.Tensor:
        """decode_step_packed on its own inputs, uploaded as one buffer (no padding)."""
        b, f = len(rows), sum(c.shape[0] for c in codes)
        flat = to_device(step_input(rows, codes, b, f, self.config.max_slots, self._device.type == "cuda"),
                         self._device)
        inputs = StepInputs.of(flat, b, f, self.config.max_graph_frames)
        return self.codec.decode_step_packed(inputs.codes, self.state, inputs.rows, inputs.packing)

