"""VocoderSessions: streamed decode through shared slots equals offline decode; slot lifecycle.

Tiny codec, fp32 on CPU. Its decoder windows (4..64 frames at their stage rates) are all
shorter than the 30-frame streams, so every ring buffer wraps during these tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moss_tts.codec import load_codec
from moss_tts.vocoder.config import NoFreeSlot, VocoderConfig
from moss_tts.vocoder.sessions import VocoderSessions

SPF = 3840  # samples per channel per codec frame


class CountingCodec:
    """The tiny codec with its (packed) decode steps counted (and optionally failing)."""

    def __init__(self, codec, fail: bool = False):
        self._codec = codec
        self.fail = fail
        self.step_batches: list[int] = []  # number of decoded rows per step

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def decode_step_packed(self, codes, state, rows, packing):
        self.step_batches.append(rows.shape[0])
        if self.fail:
            raise RuntimeError("simulated device failure")
        return self._codec.decode_step_packed(codes, state, rows, packing)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def codec(tiny_dir):
    return load_codec(tiny_dir / "codec")


@pytest.fixture(scope="module")
def streams(codec) -> torch.Tensor:
    """Two realistic code streams [2, 30, 12] (encoded noise)."""
    g = torch.Generator().manual_seed(3)
    return codec.encode(0.3 * torch.randn(2, 2, 30 * SPF, generator=g), n_quantizers=12)[0]


def make(codec, max_slots: int = 4, max_public: int = 16, **kwargs) -> tuple[VocoderSessions, CountingCodec]:
    counting = CountingCodec(codec, kwargs.pop("fail", False))
    config = VocoderConfig(max_slots=max_slots, max_public_sessions=max_public)
    return VocoderSessions(counting, config, **kwargs), counting


def offline(codec, codes: torch.Tensor) -> torch.Tensor:
    return codec.decode(codes[None])[0]


def assert_close_to_peak(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-6) -> None:
    assert actual.shape == expected.shape and actual.dtype == torch.float32 and actual.device.type == "cpu"
    err = (actual - expected).abs().max().item()
    peak = expected.abs().max().item()
    assert peak > 1e-3, "reference audio is trivial"
    assert err <= rel * peak, f"max abs diff {err:.3e} > {rel} x peak {peak:.3e}"


def chunked(codes: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    assert sum(sizes) == codes.shape[0]
    return list(codes.split(sizes))


def stream(sessions: VocoderSessions, seq_id, codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    return torch.cat([sessions.decode({seq_id: c})[seq_id] for c in chunked(codes, sizes)], dim=-1)


def assert_stats(sessions, **expected) -> None:
    stats = sessions.stats()
    actual = {name: getattr(stats, name) for name in expected}
    assert actual == expected, f"stats {stats}"


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("kwargs, field", [({"max_slots": 0}, "max_slots"), ({"n_vq": 1.5}, "n_vq"),
                                           ({"dtype": "int8"}, "dtype"), ({"device": "gpu"}, "device")])
def test_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        VocoderConfig(**kwargs)


def test_config_must_match_the_codec(codec):
    assert VocoderConfig(dtype=torch.bfloat16).dtype == "bfloat16"
    with pytest.raises(ValueError, match="same device and dtype"):
        VocoderSessions(codec, VocoderConfig(dtype="bfloat16"))
    with pytest.raises(ValueError, match="n_vq=33"):
        VocoderSessions(codec, VocoderConfig(n_vq=33))


# ------------------------------------------------------------------ streaming equals offline
def test_chunked_stream_equals_offline(codec, streams):
    sessions, _ = make(codec)
    sessions.start("a")
    audio = stream(sessions, "a", streams[0], [1, 5, 5, 5, 5, 5, 4])
    assert_close_to_peak(audio, offline(codec, streams[0]))
    assert_stats(sessions, decode_calls=7, frames_decoded=30, active_slots=1, free_slots=3)


def test_interleaved_sequences_with_different_chunkings(codec, streams):
    sessions, counting = make(codec)
    sessions.start("a")
    sessions.start(7)
    pending = {"a": chunked(streams[0], [1, 5, 5, 5, 5, 5, 4]), 7: chunked(streams[1], [3, 5, 2, 5, 3, 3, 3, 3, 3])}
    outputs = {"a": [], 7: []}
    while any(pending.values()):
        call = {sid: chunks.pop(0) for sid, chunks in pending.items() if chunks}
        for sid, audio in sessions.decode(call).items():
            assert audio.shape == (2, call[sid].shape[0] * SPF)
            outputs[sid].append(audio)
    assert_close_to_peak(torch.cat(outputs["a"], -1), offline(codec, streams[0]))
    assert_close_to_peak(torch.cat(outputs[7], -1), offline(codec, streams[1]))
    assert counting.step_batches == [2] * 7 + [1] * 2  # one step per call, whatever the lengths


def test_chunks_of_different_lengths_share_one_decode_step(codec, streams):
    sessions, counting = make(codec)
    sessions.start("a")
    sessions.start("b")
    sessions.start("c")
    out = sessions.decode({"a": streams[0, :6], "b": streams[1, :6], "c": streams[1, :2]})
    assert counting.step_batches == [3]  # 6, 6 and 2 frames packed into one step
    assert_stats(sessions, decode_calls=1, frames_decoded=14)
    assert_close_to_peak(out["a"], offline(codec, streams[0, :6]))
    assert_close_to_peak(out["b"], offline(codec, streams[1, :6]))
    assert_close_to_peak(out["c"], offline(codec, streams[1, :2]))


def test_prime_then_decode_continues_the_stream(codec, streams):
    sessions, _ = make(codec)
    sessions.start("a")
    sessions.prime("a", streams[0, :10])
    audio = stream(sessions, "a", streams[0, 10:], [4, 16])
    assert_close_to_peak(audio, offline(codec, streams[0])[:, 10 * SPF:])
    assert_stats(sessions, decode_calls=4, frames_decoded=30)  # 16 frames: two pieces of max_graph_frames


def test_empty_chunk_returns_empty_audio_without_a_step(codec, streams):
    sessions, counting = make(codec)
    sessions.start("a")
    out = sessions.decode({"a": streams[0, :0]})
    assert out["a"].shape == (2, 0) and counting.step_batches == []


# ------------------------------------------------------------------ slot lifecycle
def test_slot_reuse_after_end_starts_fresh(codec, streams):
    sessions, _ = make(codec, max_slots=1)
    assert sessions.start("a") == 0
    stream(sessions, "a", streams[0, :12], [6, 6])
    sessions.end("a")
    assert sessions.start("b") == 0
    assert_close_to_peak(stream(sessions, "b", streams[1], [7, 23]), offline(codec, streams[1]))
    sessions.end("b")
    sessions.start("a")  # an ended id may come back as a new sequence
    assert_close_to_peak(stream(sessions, "a", streams[0, 12:], [18]), offline(codec, streams[0, 12:]))
    assert_stats(sessions, sessions_started=3, sessions_ended=2, active_slots=1)


def test_no_free_slot_when_full(codec):
    sessions, _ = make(codec, max_slots=2)
    sessions.start("a")
    sessions.start("b")
    with pytest.raises(NoFreeSlot, match="all 2 vocoder slots"):
        sessions.start("c")
    sessions.end("a")
    assert sessions.start("c") == 0
    assert_stats(sessions, active_slots=2, free_slots=0, sessions_started=3)


def test_public_sessions_share_their_quota_and_never_take_the_rest(codec):
    sessions, _ = make(codec, max_slots=4, max_public=1)
    sessions.start("direct-1", is_public=True)
    with pytest.raises(NoFreeSlot, match="direct callers"):
        sessions.start("direct-2", is_public=True)
    for name in ("entry-1", "entry-2", "entry-3"):  # the pipeline's own sessions still find slots
        sessions.start(name)
    sessions.end("direct-1")
    sessions.end("entry-1")
    assert sessions.start("direct-2", is_public=True) in (0, 1)


def test_a_call_decodes_only_the_sessions_with_work(codec, streams):
    sessions, counting = make(codec, max_slots=64)
    for name in ("a", "b"):
        sessions.start(name)
    sessions.decode({"a": streams[0, :3]})
    assert counting.step_batches == [1]  # one row computed, not 64


def test_expire_frees_idle_slots(codec, streams):
    clock = FakeClock()
    sessions, _ = make(codec, clock=clock)
    sessions.start("idle")
    sessions.start("busy")
    clock.now = 5.0
    sessions.decode({"busy": streams[0, :2]})
    clock.now = 6.0
    assert sessions.expire(idle_seconds=3.0) == ["idle"]
    assert sessions.expire(idle_seconds=3.0, now=7.0) == []
    assert sessions.expire(idle_seconds=3.0, now=8.5) == ["busy"]
    assert_stats(sessions, sessions_expired=2, active_slots=0, free_slots=4)
    with pytest.raises(KeyError, match="never started, or already ended, cancelled or expired"):
        sessions.decode({"idle": streams[0, :1]})


def test_cancel_frees_the_slot_and_is_counted(codec):
    sessions, _ = make(codec, max_slots=1)
    sessions.start("a")
    sessions.cancel("a")
    assert "a" not in sessions
    sessions.start("b")
    assert_stats(sessions, sessions_cancelled=1, sessions_ended=0, active_slots=1)


def test_unknown_and_duplicate_ids(codec, streams):
    sessions, _ = make(codec)
    for call in (lambda: sessions.end("x"), lambda: sessions.cancel("x"), lambda: sessions.prime("x", streams[0, :1])):
        with pytest.raises(KeyError, match="'x'"):
            call()
    sessions.start("a")
    with pytest.raises(ValueError, match="already active"):
        sessions.start("a")


def test_bad_chunk_changes_no_state(codec, streams):
    sessions, counting = make(codec)
    sessions.start("a")
    sessions.start("b")
    bad = [streams[0, :3, :8], streams[0, :3].float(), torch.full((3, 12), 1024)]
    for chunk in bad:
        with pytest.raises(ValueError, match="sequence 'b'"):
            sessions.decode({"a": streams[0, :3], "b": chunk})
    assert counting.step_batches == []
    assert_close_to_peak(stream(sessions, "a", streams[0], [30]), offline(codec, streams[0]))


def test_check_takes_numpy_and_torch_alike_and_returns_numpy(codec, streams):
    sessions, _ = make(codec)
    chunk = streams[0, :3]
    for codes in (chunk, chunk.int(), chunk.numpy(), chunk.numpy().astype(np.int16)):
        checked = sessions.check("a", codes)
        assert isinstance(checked, np.ndarray) and np.array_equal(checked, chunk.numpy())
    bad = {"integer tensor": [chunk.numpy().astype(np.float32), chunk.numpy().astype(np.int8), chunk.tolist()],
           r"shape \[T, 12\], got \(3, 8\)": [chunk.numpy()[:, :8]],
           r"lie in \[0, ": [np.full((3, 12), -1), np.full((3, 12), codec.codebook_size)]}
    for message, chunks in bad.items():
        for codes in chunks:
            with pytest.raises(ValueError, match=f"sequence 'a': codes must .*{message}"):
                sessions.check("a", codes)
    assert sessions.check("a", np.zeros((0, 12), np.uint8)).shape == (0, 12)


def test_numpy_chunks_decode_like_torch_chunks(codec, streams):
    sessions, _ = make(codec)
    sessions.start("a")
    audio = [sessions.decode({"a": c.numpy()})["a"] for c in chunked(streams[0], [2, 10, 18])]
    assert all(isinstance(a, torch.Tensor) for a in audio)
    assert_close_to_peak(torch.cat(audio, -1), offline(codec, streams[0]))


def test_failed_decode_step_ends_the_sequences_of_the_call(codec, streams):
    sessions, counting = make(codec, fail=True)
    sessions.start("a")
    sessions.start("b")
    sessions.start("c")
    with pytest.raises(RuntimeError, match="simulated"):
        sessions.decode({"a": streams[0, :2], "b": streams[1, :2]})
    assert "a" not in sessions and "b" not in sessions and "c" in sessions
    assert_stats(sessions, sessions_failed=2, active_slots=1)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_on_the_gpu_starting_and_launching_a_round_never_wait_for_the_device(tiny_dir, streams, cuda_graphs):
    """The in-process worker launches round k+1 before it lands round k: starting sessions (the
    slots' reset) and launching a round (inputs copied into a graph's static buffers, or the
    eager step's inputs) must only enqueue work. Under torch's sync debug mode "error" any wait
    raises; the audio read back afterwards still equals offline decode, and later calls do not
    overwrite it (each step's audio lands in a fresh pinned host tensor). The first call brings
    torch tensors (the `vocoder` model), the second numpy arrays checked already (the worker)."""
    codec = load_codec(tiny_dir / "codec", torch.device("cuda"), torch.float32).eval()
    sessions = VocoderSessions(codec, VocoderConfig(max_slots=4, max_public_sessions=4, device="cuda",
                                                    cuda_graphs=cuda_graphs, max_step_rows=4))
    chunks = {0: streams[0, :2], 1: streams[1, :2]}
    arrays = {seq: streams[seq, 2:6].numpy() for seq in (0, 1)}
    torch.cuda.set_sync_debug_mode("error")
    try:
        sessions.start_many([0, 1])
        pending = [sessions.decode_async(chunks), sessions.decode_async(arrays, checked=True)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    audio = [p.wait() for p in pending]
    kept = [{seq: a.copy() for seq, a in call.items()} for call in audio]
    with torch.inference_mode():
        expected = codec.decode(streams[:, :6].cuda()).float().cpu().numpy()
    for seq in (0, 1):
        got = np.concatenate([audio[0][seq], audio[1][seq]], axis=-1)
        assert np.abs(got - expected[seq]).max() <= 1e-4 * np.abs(expected[seq]).max(), seq
    for start in range(6, 30, 4):  # more steps, more pinned blocks taken and given back
        sessions.decode({0: streams[0, start:start + 4], 1: streams[1, start:start + 4]})
    assert all(np.array_equal(call[seq], copy[seq]) for call, copy in zip(audio, kept) for seq in (0, 1))
