"""ReferenceEncoder: content-addressed LRU, single flight, batched misses, per-item errors.

Threads are ordered with Events and Semaphores only (never sleeps): the codec's encode can be
held at a gate, and a test subclass signals each claim and each drain.
"""

from __future__ import annotations

import io
import threading

import pytest
import soundfile as sf
import torch

from moss_tts.codec import load_codec
from moss_tts.reference.audio import AudioError, load_reference
from moss_tts.reference.codes import encode_references
from moss_tts.reference.encoder import ReferenceCacheConfig, ReferenceEncoder, encoder_hash
from moss_tts.reference.lru import TensorLRU
from shared_state import SharedList
from test_error_text import assert_no_object_repr

WAIT_S = 30  # generous bound on any wait: a bug shows up as a failed wait, not a hung suite
CODES_BYTES = 5 * 12 * 8  # 0.4 s -> 5 frames x 12 codes x int64


def wav_bytes(seed: int, seconds: float = 0.4, rate: int = 48000) -> bytes:
    g = torch.Generator().manual_seed(seed)
    samples = 0.3 * torch.randn(int(seconds * rate), 2, generator=g)
    buf = io.BytesIO()
    sf.write(buf, samples.numpy(), rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


SHORT = 0.01  # seconds: decodes fine but is shorter than one codec frame (80 ms)


class GatedCodec:
    """The tiny codec, with the batch size of every encode() recorded and an optional gate. encode()
    runs on whichever caller thread drains the queue: the sizes are a SharedList."""

    def __init__(self, codec, gate: threading.Event | None = None):
        self._codec = codec
        self.gate = gate
        self.entered = threading.Event()
        self.batch_sizes: SharedList[int] = SharedList()

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def encode(self, audio, *args, **kwargs):
        self.batch_sizes.append(audio.shape[0])
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S), "test never opened the encode gate"
        return self._codec.encode(audio, *args, **kwargs)


class ObservedEncoder(ReferenceEncoder):
    """Signals every claim and every drain; can hold owners before they prepare their audio."""

    def __init__(self, *args, hold: threading.Event | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.claimed = threading.Semaphore(0)
        self.draining = threading.Semaphore(0)
        self.hold = hold

    def _claim(self, keys):
        out = super()._claim(keys)
        self.claimed.release()
        return out

    def _prepare(self, owned):
        if self.hold is not None:
            assert self.hold.wait(WAIT_S), "test never released the prepare hold"
        super()._prepare(owned)

    def _drain(self):
        self.draining.release()
        super()._drain()


class Caller(threading.Thread):
    """encode_many on its own thread; keeps the result or the exception."""

    def __init__(self, encoder, audios):
        super().__init__(daemon=True)
        self.encoder, self.audios = encoder, audios
        self.result = self.error = None

    def run(self):
        try:
            self.result = self.encoder.encode_many(self.audios)
        except Exception as exc:
            self.error = exc


def acquire(semaphore: threading.Semaphore, times: int) -> None:
    for _ in range(times):
        assert semaphore.acquire(timeout=WAIT_S)


def finish(callers: list[Caller]) -> None:
    for caller in callers:
        caller.join(WAIT_S)
        assert not caller.is_alive()


def assert_stats(encoder, **expected) -> None:
    stats = encoder.stats()
    actual = {name: getattr(stats, name) for name in expected}
    assert actual == expected, f"stats {stats}"


@pytest.fixture(scope="module")
def codec(tiny_dir):
    return load_codec(tiny_dir / "codec")


def make(codec, gate=None, observed=False, hold=None, **config) -> tuple[ReferenceEncoder, GatedCodec]:
    gated = GatedCodec(codec, gate)
    cls_kwargs = {"hold": hold} if observed else {}
    cls = ObservedEncoder if observed else ReferenceEncoder
    return cls(gated, ReferenceCacheConfig(**config), "tiny-codec@test", **cls_kwargs), gated


# ------------------------------------------------------------------ config and keys
@pytest.mark.parametrize("field, value", [("max_entries", 0), ("max_bytes", -1), ("n_vq", True), ("enabled", 1)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        ReferenceCacheConfig(**{field: value})


def test_encoder_hash_covers_every_field():
    base = (12, 48000, 2, "cpu", torch.float32, "codec-a")
    variants = [(8,) + base[1:], base[:3] + ("cuda:0",) + base[4:], base[:4] + (torch.bfloat16, "codec-a"),
                base[:5] + ("codec-b",), (12, 24000) + base[2:]]
    hashes = {encoder_hash(*v) for v in [base] + variants}
    assert len(hashes) == 1 + len(variants)


def test_str_input_is_refused_not_read_as_a_path(codec):
    encoder, _ = make(codec)
    with pytest.raises(TypeError, match="reference 0 must be bytes"):
        encoder.encode_many(["/etc/passwd"])


# ------------------------------------------------------------------ hits, misses, LRU
def test_warm_up_encodes_without_caching_or_counting(codec):
    encoder, gated = make(codec)
    encoder.warm_up()
    assert gated.batch_sizes.snapshot() == [1, 2]  # one reference, then a padded batch of two
    assert_stats(encoder, hits=0, misses=0, encodes=0, items_encoded=0, entries=0, bytes=0)
    audio = wav_bytes(1)
    assert torch.equal(encoder.encode_many([audio])[0], encode_references(codec, [load_reference(audio)])[0])


def test_repeat_is_a_hit_with_equal_codes(codec):
    encoder, gated = make(codec)
    audio = wav_bytes(1)
    (first,) = encoder.encode_many([audio])
    (again,) = encoder.encode_many([audio])
    expected = encode_references(codec, [load_reference(audio)])[0]
    assert first.shape == (5, 12) and first.dtype == torch.long and first.device.type == "cpu"
    assert torch.equal(first, expected) and torch.equal(again, expected)
    assert_stats(encoder, hits=1, misses=1, encodes=1, items_encoded=1, entries=1, bytes=CODES_BYTES)
    again.fill_(7)  # callers own their copy
    assert torch.equal(encoder.encode_many([audio])[0], expected)


def test_different_bytes_miss(codec):
    encoder, _ = make(codec)
    a, b = encoder.encode_many([wav_bytes(1)]), encoder.encode_many([wav_bytes(2)])
    assert not torch.equal(a[0], b[0])
    assert_stats(encoder, hits=0, misses=2, encodes=2, entries=2)


def test_lru_evicts_least_recently_used_by_entries(codec):
    encoder, _ = make(codec, max_entries=2)
    a, b, c = wav_bytes(1), wav_bytes(2), wav_bytes(3)
    encoder.encode_many([a])
    encoder.encode_many([b])
    encoder.encode_many([a])  # a is now the most recently used
    encoder.encode_many([c])  # evicts b
    assert_stats(encoder, hits=1, misses=3, entries=2, evictions=1)
    encoder.encode_many([a])
    encoder.encode_many([b])
    assert_stats(encoder, hits=2, misses=4, evictions=2)


def test_lru_evicts_by_bytes(codec):
    encoder, _ = make(codec, max_bytes=2 * CODES_BYTES + CODES_BYTES // 2)
    for seed in (1, 2, 3):
        encoder.encode_many([wav_bytes(seed)])
    assert_stats(encoder, entries=2, bytes=2 * CODES_BYTES, evictions=1)
    encoder.encode_many([wav_bytes(1)])  # the oldest went first
    assert_stats(encoder, hits=0, misses=4, evictions=2)


def test_tensor_lru_skips_an_item_larger_than_the_budget():
    lru = TensorLRU(max_entries=4, max_bytes=100)
    assert lru.put("small", torch.zeros(10, dtype=torch.long))
    assert not lru.put("huge", torch.zeros(20, dtype=torch.long))
    assert len(lru) == 1 and lru.num_bytes == 80 and lru.num_evictions == 0


def test_disabled_cache_encodes_every_time(codec):
    encoder, gated = make(codec, enabled=False)
    audio = wav_bytes(1)
    results = [encoder.encode_many([audio])[0] for _ in range(3)]
    assert all(torch.equal(r, results[0]) for r in results)
    assert gated.batch_sizes.snapshot() == [1, 1, 1]
    assert_stats(encoder, hits=0, misses=3, encodes=3, entries=0, bytes=0)


# ------------------------------------------------------------------ batching and single flight
def test_misses_of_one_call_share_one_codec_call(codec):
    encoder, gated = make(codec)
    audios = [wav_bytes(1), wav_bytes(2, seconds=0.5), wav_bytes(3, seconds=0.3)]
    codes = encoder.encode_many(audios)
    assert gated.batch_sizes.snapshot() == [3]
    assert [c.shape[0] for c in codes] == [5, 6, 3]
    for audio, got in zip(audios, codes):  # padding inside the batch changes nothing
        assert torch.equal(got, encode_references(codec, [load_reference(audio)])[0])
    assert_stats(encoder, misses=3, encodes=1, items_encoded=3, entries=3)


def test_concurrent_identical_misses_encode_once(codec):
    gate = threading.Event()
    encoder, gated = make(codec, gate, observed=True)
    callers = [Caller(encoder, [wav_bytes(1)]) for _ in range(8)]
    for caller in callers:
        caller.start()
    acquire(encoder.claimed, 8)  # every thread is registered before the one encode proceeds
    gate.set()
    finish(callers)
    assert all(c.error is None and torch.equal(c.result[0], callers[0].result[0]) for c in callers)
    assert gated.batch_sizes.snapshot() == [1]
    assert_stats(encoder, misses=8, coalesced_waits=7, encodes=1, items_encoded=1, entries=1)


def test_misses_arriving_during_an_encode_join_the_next_batch(codec):
    gate = threading.Event()
    encoder, gated = make(codec, gate, observed=True)
    first = Caller(encoder, [wav_bytes(1)])
    first.start()
    assert gated.entered.wait(WAIT_S)
    later = [Caller(encoder, [wav_bytes(2)]), Caller(encoder, [wav_bytes(3)])]
    for caller in later:
        caller.start()
    acquire(encoder.draining, 3)  # both later callers have queued their audio
    gate.set()
    finish([first] + later)
    assert gated.batch_sizes.snapshot() == [1, 2]
    assert_stats(encoder, misses=3, encodes=2, items_encoded=3, coalesced_waits=0)


# ------------------------------------------------------------------ errors
def test_bad_item_fails_only_its_caller(codec):
    encoder, gated = make(codec)
    good = [wav_bytes(1), wav_bytes(2)]
    with pytest.raises(AudioError, match="could not be decoded") as info:
        encoder.encode_many([good[0], b"not audio", good[1]])
    assert_no_object_repr(str(info.value))
    assert gated.batch_sizes.snapshot() == [2]  # the good items were still encoded and cached
    encoder.encode_many(good)
    assert_stats(encoder, hits=2, misses=3, items_encoded=2, entries=2)


def test_short_item_in_a_shared_batch_fails_only_its_caller(codec):
    gate = threading.Event()
    encoder, gated = make(codec, gate, observed=True)
    first = Caller(encoder, [wav_bytes(1)])
    first.start()
    assert gated.entered.wait(WAIT_S)
    short, good = Caller(encoder, [wav_bytes(2, seconds=SHORT)]), Caller(encoder, [wav_bytes(3)])
    short.start()
    good.start()
    acquire(encoder.draining, 3)  # both queued: they are drained as one batch
    gate.set()
    finish([first, short, good])
    assert isinstance(short.error, AudioError) and "shorter than one codec frame" in str(short.error)
    assert first.error is None and good.error is None and good.result[0].shape == (5, 12)
    assert gated.batch_sizes.snapshot() == [1, 1]  # the batch of two was retried item by item
    assert_stats(encoder, items_encoded=2, entries=2)


def test_waiters_share_the_owner_error_and_failures_are_not_cached(codec):
    hold = threading.Event()
    encoder, gated = make(codec, observed=True, hold=hold)
    audio = wav_bytes(2, seconds=SHORT)
    callers = [Caller(encoder, [audio]) for _ in range(4)]
    for caller in callers:
        caller.start()
    acquire(encoder.claimed, 4)
    hold.set()
    finish(callers)
    assert isinstance(callers[0].error, AudioError)
    assert all(c.error is callers[0].error for c in callers)
    assert_stats(encoder, misses=4, coalesced_waits=3, items_encoded=0, entries=0)
    with pytest.raises(AudioError):
        encoder.encode_many([audio])  # tried again, not served from a cached failure
    assert_stats(encoder, misses=5, coalesced_waits=3)
    assert gated.batch_sizes.snapshot() == []
