"""VocoderGraphs: the padded static-buffer step equals the plain eager step; chunks of different
lengths share one packed step; padding never touches a real row (padding rows decode nothing on
the scratch row, padding frames belong to no row); long chunks are decoded in graphed pieces. On a GPU: captured replay
equals the uncaptured padded step bit for bit, and streaming through graphs equals offline decode.

CPU tests run the graphs' step uncaptured (VocoderSessions(capture=False)); the GPU tests at the
bottom are skipped without CUDA (conftest's `gpu` marker).
"""

from __future__ import annotations

import logging

import pytest
import torch

from moss_tts.codec import load_codec
from moss_tts.vocoder.config import NoFreeSlot, VocoderConfig
from moss_tts.vocoder.graphs import VocoderGraphs, frame_buckets, row_buckets
from moss_tts.vocoder.sessions import VocoderSessions

SPF = 3840  # samples per channel per codec frame
SCHEDULE = [2, 10, 10, 8]  # the pipeline's chunking: 2 frames, then 10, then the rest


@pytest.fixture(scope="module")
def codec(tiny_dir):
    return load_codec(tiny_dir / "codec")


@pytest.fixture(scope="module")
def streams(codec) -> torch.Tensor:
    """Five realistic code streams [5, 30, 12] (encoded noise)."""
    g = torch.Generator().manual_seed(5)
    return codec.encode(0.3 * torch.randn(5, 2, 30 * SPF, generator=g), n_quantizers=12)[0]


def make(codec, max_slots: int = 4, graphs: bool = True, capture: bool = False, device: str = "cpu",
         **config) -> VocoderSessions:
    config = VocoderConfig(max_slots=max_slots, cuda_graphs=graphs, device=device, **config)
    return VocoderSessions(codec, config, capture=capture)


def run_schedule(sessions: VocoderSessions, streams: torch.Tensor, ids: list, sizes: list[int] = SCHEDULE,
                 offset: int = 0) -> dict:
    """Start `ids`, feed stream i to ids[i] in `sizes` chunks (all ids in each call); the audio."""
    for sid in ids:
        sessions.start(sid)
    out = {sid: [] for sid in ids}
    start = offset
    for size in sizes:
        call = {sid: streams[i, start:start + size] for i, sid in enumerate(ids)}
        for sid, audio in sessions.decode(call).items():
            out[sid].append(audio)
        start += size
    return {sid: torch.cat(chunks, dim=-1) for sid, chunks in out.items()}


# Four sequences whose chunks differ in length in every call (as a vocoder round's do).
MIXED_SCHEDULES = {"a": [2, 10, 10, 8], "b": [4, 8, 10, 8], "c": [1, 3, 10, 10], 9: [10, 1, 7, 2]}


def run_mixed(sessions: VocoderSessions, streams: torch.Tensor) -> dict:
    """Four sequences whose chunks differ in length in every call (as a vocoder round's do)."""
    schedules = MIXED_SCHEDULES
    cursors, out = dict.fromkeys(schedules, 0), {sid: [] for sid in schedules}
    for sid in schedules:
        sessions.start(sid)
    for k in range(4):
        call = {sid: streams[i, cursors[sid]:cursors[sid] + sizes[k]] for i, (sid, sizes) in enumerate(schedules.items())}
        for sid, audio in sessions.decode(call).items():
            out[sid].append(audio)
            cursors[sid] += schedules[sid][k]
    return {sid: torch.cat(chunks, dim=-1) for sid, chunks in out.items()}


def assert_same_audio(actual: dict, expected: dict) -> None:
    # Padding changes the GEMMs' row count, and a CPU BLAS may block a product differently for
    # another row count; each row is still computed from its own inputs alone, so any
    # difference is rounding: a few ulps of the peak, never a different waveform.
    assert actual.keys() == expected.keys()
    for sid in expected:
        peak = expected[sid].abs().max().item()
        assert peak > 1e-3, "reference audio is trivial"
        torch.testing.assert_close(actual[sid], expected[sid], rtol=0, atol=1e-6 * peak)


def state_rows(sessions: VocoderSessions, rows: list[int]) -> list[torch.Tensor]:
    index = torch.tensor(rows)
    return [sessions.state.frames[index].clone()] + [c[:, index].clone() for c in sessions.state.caches]


# ------------------------------------------------------------------ config and buckets
def test_buckets_are_powers_of_two_then_halves_and_max_rows():
    assert row_buckets(1) == (1,)
    assert row_buckets(4) == (1, 2, 4)
    assert row_buckets(40) == (1, 2, 4, 8, 16, 32, 40)
    assert row_buckets(256) == (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
    assert row_buckets(288) == (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 288)
    for max_rows in (33, 100, 256, 288):  # from 32 rows on, padding adds less than half
        buckets = row_buckets(max_rows)
        assert all(b / n < 1.5 for n in range(33, max_rows + 1) for b in [min(x for x in buckets if x >= n)])


def test_frame_buckets_are_row_buckets_to_64_then_quarter_then_eighth_steps():
    assert frame_buckets(1) == (1,)
    assert frame_buckets(40) == row_buckets(40)
    assert frame_buckets(100) == (1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100)
    assert frame_buckets(2560)[7:] == (64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 576, 640, 704,
                                       768, 832, 896, 960, 1024, 1152, 1280, 1408, 1536, 1664, 1792, 1920, 2048,
                                       2304, 2560)
    for max_frames in (65, 100, 1000, 2560, 2880):  # from 64 frames on, padding adds less than a quarter
        buckets = frame_buckets(max_frames)
        assert all(b / n < 1.25 for n in range(65, max_frames + 1) for b in [min(x for x in buckets if x >= n)])
        # and from 512 on, less than an eighth
        assert all(b / n < 1.125 for n in range(513, max_frames + 1) for b in [min(x for x in buckets if x >= n)])


@pytest.mark.parametrize("kwargs, field", [({"max_graph_frames": 0}, "max_graph_frames"),
                                           ({"cuda_graphs": "true"}, "cuda_graphs")])
def test_config_rejects_bad_graph_settings(kwargs, field):
    with pytest.raises(ValueError, match=field):
        VocoderConfig(**kwargs)


def test_pbtxt_parameters_override_the_adapters_defaults_and_a_bad_one_names_its_key():
    adapter = dict(max_slots=8, device="cpu", dtype="float32", cuda_graphs=True)
    assert VocoderConfig.from_parameters({"device": "auto"}, **adapter) == VocoderConfig(**adapter)
    config = VocoderConfig.from_parameters({"cuda_graphs": " True ", "max_step_rows": "32", "max_public_sessions": "4",
                                            "max_graph_frames": "6", "dtype": "auto"}, **adapter)
    assert (config.cuda_graphs, config.max_step_rows, config.max_public_sessions, config.max_graph_frames) == \
        (True, 32, 4, 6)
    assert VocoderConfig.from_parameters({"cuda_graphs": "0"}, **adapter).cuda_graphs is False
    with pytest.raises(ValueError, match="cuda_graphs='yes' is not a valid bool"):
        VocoderConfig.from_parameters({"cuda_graphs": "yes"}, **adapter)


def test_cuda_graphs_on_the_cpu_are_ignored_with_a_log_line(codec, caplog):
    with caplog.at_level(logging.INFO, logger="moss_tts.vocoder.sessions"):
        sessions = make(codec, capture=True)
    assert sessions.graphs is None and "cuda_graphs=true ignored" in caplog.text


def test_graphs_need_the_scratch_row(codec):
    with pytest.raises(ValueError, match="scratch row"):
        VocoderGraphs(codec, codec.new_decode_state(4), max_rows=4, max_frames=10, n_vq=12)
    with pytest.raises(ValueError, match="max_rows"):
        VocoderGraphs(codec, codec.new_decode_state(4), max_rows=0, max_frames=10, n_vq=12)


# ------------------------------------------------------------------ padded step equals eager
def test_padded_step_equals_the_eager_step(codec, streams):
    # 3 sequences pad to the bucket of 4 on every call.
    ids = ["a", 7, "c"]
    padded = make(codec, max_slots=5)
    expected = run_schedule(make(codec, max_slots=5, graphs=False), streams, ids)
    assert_same_audio(run_schedule(padded, streams, ids), expected)
    assert padded.stats().graph_calls == padded.stats().decode_calls == len(SCHEDULE)


def test_padding_touches_only_the_scratch_row(codec, streams):
    sessions = make(codec, max_slots=8)
    run_schedule(sessions, streams, ["x", "y", "z"], sizes=[4])  # slots 0..2 hold some state
    sessions.start("a")  # slot 3
    untouched = [1, 4, 5, 6, 7]  # y and the free slots
    before = state_rows(sessions, untouched)
    scratch_before = state_rows(sessions, [8])[1:]
    # 3 rows -> bucket 4, 2 + 2 + 3 = 7 frames -> bucket 8
    sessions.decode({"a": streams[3, :2], "x": streams[0, 4:6], "z": streams[2, 4:7]})
    assert all(torch.equal(b, a) for b, a in zip(before, state_rows(sessions, untouched)))
    assert sessions.state.frames.tolist()[:8] == [6, 4, 7, 2, 0, 0, 0, 0]
    # the padding row brought 0 frames: even the scratch row's ring is untouched, its position 0
    assert all(torch.equal(b, a) for b, a in zip(scratch_before, state_rows(sessions, [8])[1:]))
    assert int(sessions.state.frames[8]) == 0


def test_the_scratch_rows_position_stays_bounded(codec, streams):
    """Every padded step used to advance the shared scratch row (once per padding row), so after
    hours its position left the kernels' integer range and its ring writes landed in a real
    slot. Each step now restarts it: after many padded steps it is still at 0."""
    sessions = make(codec, max_slots=8)
    sessions.start("a")
    for start in range(0, 20, 2):  # 1 row -> bucket 1: no padding; 3 rows -> bucket 4: one pad row
        sessions.decode({"a": streams[0, start:start + 2]})
        assert int(sessions.state.frames[8]) == 0
    for sid in ("b", "c"):
        sessions.start(sid)
    for start in range(0, 10, 2):
        sessions.decode({sid: streams[i, start:start + 2] for i, sid in enumerate("abc")})
        assert int(sessions.state.frames[8]) == 0
    assert sessions.state.frames.tolist()[:3] == [30, 10, 10]


def test_the_scratch_row_is_never_handed_out(codec):
    sessions = make(codec, max_slots=3)
    assert sessions.state.batch_size == 4 and sessions.graphs.scratch_row == 3
    assert sorted(sessions.start(sid) for sid in "abc") == [0, 1, 2]
    with pytest.raises(NoFreeSlot):
        sessions.start("d")
    sessions.end("b")
    assert sessions.start("d") == 1


@pytest.mark.parametrize("max_slots", [3, 4])
def test_every_slot_in_use_runs_the_largest_bucket(codec, streams, max_slots):
    ids = [f"s{i}" for i in range(max_slots)]
    expected = run_schedule(make(codec, max_slots=max_slots, graphs=False), streams, ids)
    sessions = make(codec, max_slots=max_slots)
    assert_same_audio(run_schedule(sessions, streams, ids), expected)
    assert sessions.stats().graph_calls == len(SCHEDULE)


@pytest.mark.parametrize("graphs", [True, False])
def test_a_group_larger_than_max_step_rows_is_decoded_in_pieces(codec, streams, graphs):
    # 5 sequences, 2 rows per call: pieces of 2, 2, 1 per chunk length, same audio as one call.
    ids = [f"s{i}" for i in range(5)]
    expected = run_schedule(make(codec, max_slots=5, graphs=False), streams, ids)
    sessions = make(codec, max_slots=5, graphs=graphs, max_step_rows=2)
    assert_same_audio(run_schedule(sessions, streams, ids), expected)
    assert sessions.stats().decode_calls == 3 * len(SCHEDULE)
    assert sessions.stats().graph_calls == (3 * len(SCHEDULE) if graphs else 0)
    if graphs:
        assert sessions.graphs.buckets == (1, 2) and sessions.graphs.scratch_row == 5


def test_longer_chunks_are_decoded_in_graphed_pieces(codec, streams):
    ids = ["a", "b"]
    sizes = [2, 6, 3, 19]  # max_graph_frames=4: 6 = 4 + 2 and 19 = 4 x 4 + 3, every step graphed
    sessions = make(codec, max_graph_frames=4)
    out = run_schedule(sessions, streams, ids, sizes)
    assert sessions.stats().graph_calls == sessions.stats().decode_calls == 1 + 2 + 1 + 5
    assert_same_audio(out, run_schedule(make(codec, graphs=False), streams, ids, sizes))


def test_chunks_of_different_lengths_share_one_padded_step(codec, streams):
    """Each call packs the sequences' chunks of 1 to 10 frames into one step, padded to its row
    and frame buckets, and every sequence decodes as it would alone."""
    outs = {}
    for graphs in (True, False):
        sessions = make(codec, max_slots=6, graphs=graphs)
        outs[graphs] = run_mixed(sessions, streams)
        assert sessions.stats().decode_calls == 4  # one step per call
        assert sessions.stats().graph_calls == (4 if graphs else 0)
    assert_same_audio(outs[True], outs[False])
    for i, (sid, sizes) in enumerate(MIXED_SCHEDULES.items()):
        assert_same_audio({sid: outs[False][sid]}, {sid: codec.decode(streams[i:i + 1, :sum(sizes)])[0]})


def test_pieces_of_chunks_of_different_lengths_share_steps(codec, streams):
    """A call with chunks of 9 and 7 frames (4-frame graphs): steps of (4, 4), (4, 3) and (1):
    piece k of both sequences in step k, whatever its length."""
    sessions = make(codec, max_graph_frames=4)
    for sid in ("a", "b"):
        sessions.start(sid)
    out = sessions.decode({"a": streams[0, :9], "b": streams[1, :7]})
    assert sessions.stats().decode_calls == 3 and sessions.stats().frames_decoded == 16
    expected = make(codec, graphs=False)
    for sid in ("a", "b"):
        expected.start(sid)
    assert_same_audio(out, expected.decode({"a": streams[0, :9], "b": streams[1, :7]}))


def test_prime_then_graphed_chunks_continue_the_stream(codec, streams):
    sessions = make(codec)
    sessions.start("a")
    sessions.prime("a", streams[0, :12])  # reference codes: longer than a graph, two pieces
    out = torch.cat([sessions.decode({"a": c})["a"] for c in streams[0, 12:].split([2, 10, 6])], dim=-1)
    reference = codec.decode(streams[:1])[0, :, 12 * SPF:]
    assert_same_audio({"a": out}, {"a": reference})
    assert sessions.stats().graph_calls == sessions.stats().decode_calls == 2 + 3


def test_returned_audio_survives_the_next_step(codec, streams):
    # The graphs' output is one static buffer: what decode returned must be a copy of it.
    sessions = make(codec)
    sessions.start("a")
    first = sessions.decode({"a": streams[0, :2]})["a"]
    kept = first.clone()
    sessions.decode({"a": streams[0, 2:4]})
    assert torch.equal(first, kept)


# ------------------------------------------------------------------ GPU: captured graphs
def gpu_codec(tiny_dir, device: str):
    return load_codec(tiny_dir / "codec", device)


@pytest.mark.gpu
def test_graph_replay_equals_the_uncaptured_padded_step(tiny_dir, streams):
    codec = gpu_codec(tiny_dir, "cuda")
    ids = ["a", "b", "c"]
    graphed = make(codec, max_slots=8, capture=True, device="cuda")
    # rows 1, 2, 4, 8 x the frame buckets each can reach (1 .. 10 frames a row)
    assert graphed.graphs.num_graphs == 21
    eager = make(codec, max_slots=8, capture=False, device="cuda")
    sizes = [2, 10, 10, 8]
    out, expected = run_schedule(graphed, streams, ids, sizes), run_schedule(eager, streams, ids, sizes)
    for sid in ids:
        assert torch.equal(out[sid], expected[sid]), sid  # same kernels, same shapes: bit-exact


@pytest.mark.gpu
def test_graph_replay_of_mixed_lengths_equals_the_uncaptured_padded_step(tiny_dir, streams):
    codec = gpu_codec(tiny_dir, "cuda")
    graphed = make(codec, max_slots=8, capture=True, device="cuda")
    out = run_mixed(graphed, streams)
    expected = run_mixed(make(codec, max_slots=8, capture=False, device="cuda"), streams)
    assert graphed.stats().graph_calls == graphed.stats().decode_calls == 4
    for sid in out:
        assert torch.equal(out[sid], expected[sid]), sid


@pytest.mark.gpu
def test_streaming_through_graphs_equals_offline(tiny_dir, streams):
    codec = gpu_codec(tiny_dir, "cuda")
    sessions = make(codec, max_slots=8, capture=True, device="cuda")
    out = run_schedule(sessions, streams, list(range(5)))  # 5 rows -> bucket 8
    offline = codec.decode(streams.cuda()).float().cpu()
    for i in range(5):
        # fp32 on the GPU: streaming and offline attention use different kernels (masked ring
        # buffer vs blocked window), so they agree to rounding, not bit for bit.
        peak = offline[i].abs().max().item()
        torch.testing.assert_close(out[i], offline[i], rtol=0, atol=1e-4 * peak)
    assert sessions.stats().graph_calls == len(SCHEDULE)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_graphs_on_another_gpu_than_the_current_one(tiny_dir, streams):
    device = f"cuda:{torch.cuda.device_count() - 1}"
    assert torch.cuda.current_device() == 0
    codec = gpu_codec(tiny_dir, device)
    graphed = make(codec, max_slots=4, capture=True, device=device)
    eager = make(codec, max_slots=4, capture=False, device=device)
    out, expected = run_schedule(graphed, streams, ["a", "b", "c"]), run_schedule(eager, streams, ["a", "b", "c"])
    assert all(torch.equal(out[sid], expected[sid]) for sid in out)
