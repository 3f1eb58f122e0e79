"""VocoderSessions: streaming codec decode of many sequences through one batched decoder state.

One `CodecDecodeState` of `max_slots` rows is allocated once. A sequence owns one row (slot)
from `start` until `end`, `cancel`, `expire` (the sequence batcher's idle timeout) or a failed
decode; the row is reset when it is handed out again. `decode` groups the chunks of one call by
frame count and runs one `decode_step` per distinct count on a compact copy of that group's
rows (gather, decode, scatter back): the other rows' ring buffers and frame counters stay
untouched, and the cost follows the streams with work, not `max_slots`.

Sessions started without the pipeline's key (`is_public`: direct gRPC clients) share
`max_public_sessions` slots, so they can never take the slots the public entry needs.
"""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


class NoFreeSlot(RuntimeError):
    """Every vocoder slot (or every public one) holds an active sequence."""


@dataclass(frozen=True)
class VocoderConfig:
    max_slots: int = 16
    n_vq: int = 12
    device: str = "cpu"
    dtype: str = "float32"  # a key of DTYPES (a torch.dtype is accepted and stored by name)
    max_public_sessions: int = 16  # slots open to callers other than the moss_tts entry

    def __post_init__(self):
        for name in ("max_slots", "n_vq", "max_public_sessions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"VocoderConfig.{name} must be a positive integer, got {value!r}")
        if isinstance(self.dtype, torch.dtype):
            object.__setattr__(self, "dtype", str(self.dtype).removeprefix("torch."))
        if self.dtype not in DTYPES:
            raise ValueError(f"VocoderConfig.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"VocoderConfig.device {self.device!r} is not a torch device ({exc})") from None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


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


@dataclass
class _Session:
    slot: int
    last_used: float  # clock() at start or at the last decode/prime
    is_public: bool = False


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class VocoderSessions:
    """Thread-safe; sequence ids are any hashable (Triton CORRID: uint64 or string)."""

    def __init__(self, codec, config: VocoderConfig, clock: Callable[[], float] = time.monotonic):
        if config.n_vq > codec.num_quantizers:
            raise ValueError(f"VocoderConfig.n_vq={config.n_vq} exceeds the codec's {codec.num_quantizers} quantizers")
        p = next(codec.decoder.parameters())
        if p.dtype != config.torch_dtype or not _same_device(p.device, config.torch_device):
            raise ValueError(f"VocoderConfig wants {config.dtype} on {config.device} but the codec decoder is "
                             f"{p.dtype} on {p.device}; load the codec with the same device and dtype")
        self.codec = codec
        self.config = config
        self._clock = clock
        self.state = codec.new_decode_state(config.max_slots, config.torch_device, config.torch_dtype)
        self._sessions: dict[Hashable, _Session] = {}
        self._free = list(range(config.max_slots))  # heap: the lowest free slot is handed out first
        self._lock = threading.Lock()
        self._started = self._ended = self._cancelled = self._expired = self._failed = 0
        self._decode_calls = self._frames_decoded = 0

    # ---------------------------------------------------------------- lifecycle
    def start(self, seq_id: Hashable, is_public: bool = False) -> int:
        """Give `seq_id` a fresh slot and return its index."""
        with self._lock:
            if seq_id in self._sessions:
                raise ValueError(f"sequence {seq_id!r} is already active; end or cancel it before starting it again")
            if not self._free:
                raise NoFreeSlot(f"all {self.config.max_slots} vocoder slots hold active sequences; "
                                 "retry later or raise max_slots")
            num_public = sum(s.is_public for s in self._sessions.values())
            if is_public and num_public >= self.config.max_public_sessions:
                raise NoFreeSlot(f"{num_public} sequences of direct callers are active, the limit for callers "
                                 "other than the moss_tts entry (max_public_sessions); retry later")
            slot = heapq.heappop(self._free)
            mask = torch.zeros(self.config.max_slots, dtype=torch.bool)
            mask[slot] = True
            self.state.reset(mask)
            self._sessions[seq_id] = _Session(slot, self._clock(), is_public)
            self._started += 1
            return slot

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

    # ---------------------------------------------------------------- decode
    def decode(self, chunks: dict[Hashable, torch.Tensor]) -> dict[Hashable, torch.Tensor]:
        """Next frames of several sequences: {seq_id: codes [T_i, n_vq]} -> {seq_id: [2, T_i*3840] fp32 CPU}."""
        return self._run(chunks, keep_audio=True)

    def prime(self, seq_id: Hashable, codes: torch.Tensor) -> None:
        """Decode and discard (continuation mode feeds the reference frames first)."""
        self._run({seq_id: codes}, keep_audio=False)

    def stats(self) -> VocoderStats:
        with self._lock:
            active = len(self._sessions)
            return VocoderStats(active, self.config.max_slots - active, self._started, self._ended,
                                self._cancelled, self._expired, self._failed, self._decode_calls,
                                self._frames_decoded)

    # ---------------------------------------------------------------- internals
    def _session(self, seq_id: Hashable) -> _Session:
        session = self._sessions.get(seq_id)
        if session is None:
            raise KeyError(f"unknown vocoder sequence {seq_id!r}: never started, or already ended, "
                           "cancelled or expired; start it first")
        return session

    def _release(self, seq_id: Hashable) -> None:
        heapq.heappush(self._free, self._session(seq_id).slot)
        del self._sessions[seq_id]

    def _check(self, seq_id: Hashable, codes: torch.Tensor) -> torch.Tensor:
        n_vq, size = self.config.n_vq, self.codec.codebook_size
        if not isinstance(codes, torch.Tensor) or codes.dtype not in INTEGER_DTYPES:
            raise ValueError(f"sequence {seq_id!r}: codes must be an integer tensor [T, {n_vq}]")
        if codes.dim() != 2 or codes.shape[1] != n_vq:
            raise ValueError(f"sequence {seq_id!r}: codes must have shape [T, {n_vq}], got {tuple(codes.shape)}")
        # Checked here because decode_step cannot: an out-of-range code on CUDA is a device-side
        # assert that poisons the whole context, not just this request.
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= size):
            raise ValueError(f"sequence {seq_id!r}: codes must lie in [0, {size})")
        return codes

    def _run(self, chunks: dict[Hashable, torch.Tensor], keep_audio: bool) -> dict[Hashable, torch.Tensor]:
        with self._lock:
            # Validate everything first so a bad chunk leaves every sequence's state untouched.
            slots = {sid: self._session(sid).slot for sid in chunks}
            codes = {sid: self._check(sid, c) for sid, c in chunks.items()}
            groups: dict[int, list[Hashable]] = {}
            for sid, c in codes.items():
                groups.setdefault(c.shape[0], []).append(sid)
            out = {sid: torch.zeros(2, 0) for sid in groups.pop(0, [])}
            try:
                for frames, ids in groups.items():
                    out.update(self._step(frames, ids, slots, codes, keep_audio))
            except BaseException:
                # Earlier groups advanced their state but their audio never reaches the caller,
                # so no sequence of this call can continue without a gap: end them all.
                for sid in slots:
                    self._release(sid)
                self._failed += len(slots)
                raise
            now = self._clock()
            for sid in slots:
                self._sessions[sid].last_used = now
            return out if keep_audio else {}

    def _step(self, frames: int, ids: list[Hashable], slots: dict[Hashable, int],
              codes: dict[Hashable, torch.Tensor], keep_audio: bool) -> dict[Hashable, torch.Tensor]:
        """One decode_step for the sequences in `ids`, which all bring `frames` frames."""
        device = self.state.frames.device
        rows = torch.tensor([slots[sid] for sid in ids], device=device)
        batch = torch.stack([codes[sid].cpu().long() for sid in ids]).to(device)
        part = self.state.gather(rows)
        audio = self.codec.decode_step(batch, part)
        self.state.scatter(rows, part)
        self._decode_calls += 1
        self._frames_decoded += frames * len(ids)
        if not keep_audio:
            return {}
        return dict(zip(ids, audio.float().cpu().unbind(0)))  # the one device-to-host copy
