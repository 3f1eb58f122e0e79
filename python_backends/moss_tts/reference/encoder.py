"""ReferenceEncoder: reference audio bytes -> RVQ codes [frames, n_vq], behind a content-addressed LRU.

Life of one `encode_many` call:
1. Key every item: xxh3_64 of its raw bytes + the encoder hash (n_vq, sample rate, channels,
   device, dtype, codec identity), so another codec or precision never reuses an entry.
2. Claim, under the lock: cached -> hit; already being encoded by anyone -> join that Future
   (single flight); otherwise own a new Future, registered as in flight.
3. Owned items are decoded and resampled in the caller's own thread, so that CPU work runs in
   parallel across callers; a bad item fails only its own Future.
4. Drain: the thread holding the encode lock takes *every* queued item (its own and those other
   threads queued while the previous encode ran) and encodes them in one batched codec call.
5. Results enter the LRU and leave the in-flight table in one locked step, then the Futures
   resolve; each caller waits on its Futures and gets its own copy of the codes.
Failures are never cached: the next request for that key tries again.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import xxhash

from ..contract.tensors import N_VQ
from .audio import AudioError, load_reference
from .codes import encode_references
from .lru import TensorLRU

MIB = 1 << 20
WARM_UP_SECONDS = (1.0, 1.3)  # two lengths: a batch of one, and a padded batch of two ragged rows


@dataclass(frozen=True)
class ReferenceCacheConfig:
    max_entries: int = 8192
    max_bytes: int = 64 * MIB  # counted as the nbytes of the cached int64 codes
    enabled: bool = True
    n_vq: int = N_VQ

    def __post_init__(self):
        for name in ("max_entries", "max_bytes", "n_vq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ReferenceCacheConfig.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.enabled, bool):
            raise ValueError(f"ReferenceCacheConfig.enabled must be a bool, got {self.enabled!r}")


@dataclass(frozen=True)
class ReferenceCacheStats:
    hits: int
    misses: int
    coalesced_waits: int  # misses that joined an encode already in flight instead of starting one
    encodes: int  # batched codec calls
    items_encoded: int
    entries: int
    bytes: int
    evictions: int


def encoder_hash(n_vq: int, sample_rate: int, channels: int, device: torch.device | str,
                 dtype: torch.dtype, encoder_id: str) -> str:
    """Everything besides the audio that changes the codes; part of every cache key."""
    identity = f"{n_vq}|{sample_rate}|{channels}|{device}|{dtype}|{encoder_id}"
    return xxhash.xxh3_64_hexdigest(identity.encode("utf-8"))


def reference_key(audio: bytes, encoder: str) -> str:
    return f"{xxhash.xxh3_64_hexdigest(audio)}:{encoder}"


@dataclass
class _Job:
    key: str
    future: Future
    wav: torch.Tensor | None = None  # prepared stereo 48 kHz [2, S]


def _resolved(value: torch.Tensor) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class ReferenceEncoder:
    """Thread-safe. `encoder_id` names the codec weights (e.g. directory + revision): two
    encoders with the same id, n_vq, device and dtype are assumed to produce the same codes."""

    def __init__(self, codec, config: ReferenceCacheConfig, encoder_id: str):
        if not isinstance(encoder_id, str) or not encoder_id:
            raise ValueError("encoder_id must be a non-empty string naming the codec (its directory/revision)")
        if config.n_vq > codec.num_quantizers:
            raise ValueError(f"ReferenceCacheConfig.n_vq={config.n_vq} exceeds the codec's "
                             f"{codec.num_quantizers} quantizers")
        self.codec = codec
        self.config = config
        p = next(codec.encoder.parameters())
        self.encoder_hash = encoder_hash(config.n_vq, codec.sample_rate, codec.channels, p.device, p.dtype,
                                         encoder_id)
        self._lock = threading.Lock()  # guards everything below except the codec call
        self._encode_lock = threading.Lock()  # one codec call at a time; its holder drains the queue
        self._lru = TensorLRU(config.max_entries, config.max_bytes)
        self._in_flight: dict[str, Future] = {}
        self._queue: list[_Job] = []
        self._hits = self._misses = self._coalesced_waits = self._encodes = self._items_encoded = 0

    # ---------------------------------------------------------------- public
    def encode_many(self, audios: list[bytes]) -> list[torch.Tensor]:
        """Raw audio file bytes -> codes [frames_i, n_vq] int64 CPU, one per item, in order.

        Raises the first failed item's exception (AudioError for unusable audio) after the
        other items were still encoded and cached for everyone else.
        """
        for i, audio in enumerate(audios):
            # A str would be read as a file path by load_reference: never from a client.
            if not isinstance(audio, (bytes, bytearray, memoryview)):
                raise TypeError(f"reference {i} must be bytes, got {type(audio).__name__}")
        keys = [reference_key(audio, self.encoder_hash) for audio in audios]
        flights, owned = self._claim(keys)
        if owned:
            audio_of = dict(zip(keys, audios))  # equal keys mean equal bytes
            self._prepare({key: (audio_of[key], future) for key, future in owned.items()})
            self._drain()
        # Callers own their copy: an in-place edit downstream must not corrupt the cache.
        return [future.result().clone() for future in flights]

    def warm_up(self, seconds: tuple[float, ...] = WARM_UP_SECONDS) -> None:
        """Encode synthetic references once, uncached and uncounted, before the first request.
        On a GPU the encoder's attention is Triton kernels (kernels/window_attention.py) compiled
        at their first call, and every reference request waits behind the encode that compiles
        them, as do the ensemble's (its ref_encoder step runs even without a reference). In
        round 10 (issue 34) the first soak on each fresh H200 machine stopped for 20-30 s a few
        seconds in (no request admitted, every one in flight waiting), and never on the second
        server of a machine, whose kernel cache was warm: one stop outlasted the clients'
        30 s and 93 streams failed. That cause is inferred, not profiled."""
        rate, spf = self.codec.sample_rate, self.codec.samples_per_frame
        g = torch.Generator().manual_seed(0)
        wavs = [0.1 * torch.randn(2, max(spf, round(s * rate)), generator=g) for s in seconds]
        with self._encode_lock:
            encode_references(self.codec, wavs[:1], self.config.n_vq)
            encode_references(self.codec, wavs, self.config.n_vq)

    def stats(self) -> ReferenceCacheStats:
        with self._lock:
            return ReferenceCacheStats(self._hits, self._misses, self._coalesced_waits, self._encodes,
                                       self._items_encoded, len(self._lru), self._lru.num_bytes,
                                       self._lru.num_evictions)

    # ---------------------------------------------------------------- steps
    def _claim(self, keys: list[str]) -> tuple[list[Future], dict[str, Future]]:
        """One Future per item; returns them and the ones this caller must encode."""
        flights, owned = [], {}
        with self._lock:
            for key in keys:
                cached = self._lru.get(key) if self.config.enabled else None
                if cached is not None:
                    self._hits += 1
                    flights.append(_resolved(cached))
                    continue
                self._misses += 1
                future = self._in_flight.get(key)
                if future is None:
                    future = self._in_flight[key] = owned[key] = Future()
                else:
                    self._coalesced_waits += 1
                flights.append(future)
        return flights, owned

    def _prepare(self, owned: dict[str, tuple[bytes, Future]]) -> None:
        jobs = []
        for key, (audio, future) in owned.items():
            job = _Job(key, future)
            try:
                job.wav = load_reference(audio)
            except Exception as exc:  # every owned Future must resolve, or its waiters hang
                self._fail([job], exc)
                continue
            jobs.append(job)
        with self._lock:
            self._queue.extend(jobs)

    def _drain(self) -> None:
        # Whoever gets the encode lock first encodes everything queued so far, so misses that
        # arrive while a codec call runs are batched into the next call. A caller whose jobs
        # were taken by another thread finds an empty queue: they were resolved before that
        # thread released the lock.
        with self._encode_lock:
            with self._lock:
                batch, self._queue = self._queue, []
            if batch:
                self._encode(batch)

    def _encode(self, batch: list[_Job]) -> None:
        try:
            codes = encode_references(self.codec, [job.wav for job in batch], self.config.n_vq)
        except AudioError as exc:
            if len(batch) == 1:
                self._fail(batch, exc)
                return
            # One unusable item (e.g. shorter than a frame) must not fail the rest: encode_references
            # raises before any codec work, so retrying item by item costs nothing extra.
            for job in batch:
                self._encode([job])
            return
        except BaseException as exc:
            self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._publish(batch, codes)

    def _publish(self, batch: list[_Job], codes: list[torch.Tensor]) -> None:
        with self._lock:
            self._encodes += 1
            self._items_encoded += len(batch)
            for job, item_codes in zip(batch, codes):
                # Cache and un-register in one locked step: a new caller sees one or the other.
                if self.config.enabled:
                    self._lru.put(job.key, item_codes)
                del self._in_flight[job.key]
        for job, item_codes in zip(batch, codes):
            job.future.set_result(item_codes)

    def _fail(self, batch: list[_Job], exc: BaseException) -> None:
        with self._lock:
            for job in batch:
                del self._in_flight[job.key]
        for job in batch:
            job.future.set_exception(exc)
