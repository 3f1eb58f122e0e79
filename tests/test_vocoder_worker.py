"""VocoderWorker: the pipeline's in-process decode. Chunks in flight per stream, batched across
streams, long jobs one piece per round, order, START/END, cancel, errors that stay with their
stream, shutdown. Tiny codec, fp32 on CPU; audio checked against offline decode."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from moss_tts.codec import load_codec
from moss_tts.contract.errors import ChildError, ErrorKind
from moss_tts.vocoder.config import VocoderConfig, VocoderPlacement, codec_fusion, codec_ring_kernel
from moss_tts.vocoder.sessions import VocoderSessions
from moss_tts.vocoder.worker import VocoderWorker
from shared_state import SharedList

SPF = 3840
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def codec(tiny_dir):
    return load_codec(tiny_dir / "codec")


@pytest.fixture(scope="module")
def streams(codec) -> np.ndarray:
    """Three code streams [3, 30, 12] (encoded noise)."""
    g = torch.Generator().manual_seed(5)
    return codec.encode(0.3 * torch.randn(3, 2, 30 * SPF, generator=g), n_quantizers=12)[0].numpy()


@pytest.fixture(scope="module")
def offline(codec, streams) -> np.ndarray:
    with torch.inference_mode():
        return codec.decode(torch.from_numpy(streams)).float().numpy()  # [3, 2, 30*SPF]


class Gate:
    """Holds the worker inside its next decode until released: lets a test queue work mid-round.
    The worker thread records its rounds while the test reads them: a SharedList."""

    def __init__(self, sessions):
        self.sessions, self.decode = sessions, sessions.decode_async
        self.entered, self.release = threading.Event(), threading.Event()
        self.rounds: SharedList[dict] = SharedList()  # {seq: frames} per decode call
        sessions.decode_async = self  # the worker launches a round with decode_async

    def __call__(self, chunks, checked=False):
        self.rounds.append({seq: c.shape[0] for seq, c in chunks.items()})
        self.entered.set()
        assert self.release.wait(TIMEOUT_S)
        return self.decode(chunks, checked)


def make(codec, max_slots=4, piece_frames=10, **kwargs):
    sessions = VocoderSessions(codec, VocoderConfig(max_slots=max_slots, max_public_sessions=max_slots,
                                                    max_graph_frames=piece_frames))
    return VocoderWorker(sessions, **kwargs)


@contextmanager
def gated(codec, **kwargs):
    """A worker whose decode calls wait at a Gate: a test queues work behind a round in flight."""
    worker = make(codec, **kwargs)
    gate = Gate(worker.sessions)
    try:
        yield worker, gate
    finally:
        gate.release.set()
        worker.stop()


def close(a, b):
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(b).max())


def test_chunks_in_flight_decode_in_order_and_equal_offline(codec, streams, offline):
    worker = make(codec)
    woken = SharedList()  # on_done runs on the worker thread
    try:
        jobs = []
        for seq in range(2):  # all chunks of both streams queued before any is answered
            cuts = [0, 2, 6, 14, 24, 30]  # the pipeline's growing chunks
            for k, (a, b) in enumerate(zip(cuts, cuts[1:])):
                jobs.append((seq, a, b, worker.submit(seq, streams[seq, a:b], start=k == 0, end=False,
                                                      on_done=lambda seq=seq: woken.append(seq))))
        ends = [worker.submit(seq, np.zeros((0, 12), np.int64), start=False, end=True) for seq in range(2)]
        for seq in range(2):
            audio = np.concatenate([job.result(TIMEOUT_S) for s, _, _, job in jobs if s == seq], axis=-1)
            close(audio, offline[seq])
        for end in ends:
            assert end.result(TIMEOUT_S).shape == (2, 0)
        # Read after the ENDs: a job's result is ready before its on_done runs, and each END is
        # answered after its stream's last wake, on the same worker thread.
        assert sorted(woken.snapshot()) == [0] * 5 + [1] * 5  # one wake per answered chunk
        stats = worker.stats()
        assert (stats.active_slots, stats.sessions_started, stats.sessions_ended) == (0, 2, 2)
        assert stats.rounds <= 5 + 1  # both streams' k-th chunks share a round (not 10 rounds)
    finally:
        worker.stop()


def test_a_long_job_goes_one_piece_per_round_beside_the_streams(codec, streams, offline):
    with gated(codec, piece_frames=4) as (worker, gate):
        first = worker.submit("stream", streams[0, :2], start=True, end=False)
        assert gate.entered.wait(TIMEOUT_S)  # the worker is inside round 1; queue behind it
        long = worker.submit("offline", streams[1], start=True, end=True)  # 30 frames: 8 pieces of <= 4
        second = worker.submit("stream", streams[0, 2:6], start=False, end=False)
        gate.release.set()
        close(np.concatenate([first.result(TIMEOUT_S), second.result(TIMEOUT_S)], -1), offline[0][:, :6 * SPF])
        close(long.result(TIMEOUT_S), offline[1])
        # Round 2 decoded the stream's next chunk beside the long job's first piece.
        rounds = gate.rounds.snapshot()
        assert rounds[1] == {"offline": 4, "stream": 4}
        assert all(max(r.values()) <= 4 for r in rounds)
        assert "offline" not in worker.sessions  # its START|END job freed the slot


def test_a_jobs_audio_pieces_are_joined_by_the_thread_that_asks_for_them(codec, streams, offline, monkeypatch):
    """Joining gives the GIL up while numpy copies: on the worker thread that was a wait for the GIL
    per job (20% of the worker under the H200 soak), so the stream thread joins its own audio."""
    joins, concatenate = SharedList(), np.concatenate

    def recording(arrays, *args, **kwargs):
        if kwargs.get("axis") == -1 and all(getattr(a, "dtype", None) == np.float32 for a in arrays):
            joins.append(threading.current_thread().name)  # worker thread or this one: a SharedList
        return concatenate(arrays, *args, **kwargs)

    monkeypatch.setattr(np, "concatenate", recording)
    worker = make(codec, piece_frames=4)
    try:
        job = worker.submit("long", streams[1], start=True, end=True)  # 30 frames: 8 rounds of <= 4
        assert job.wait(TIMEOUT_S) and joins.snapshot() == []  # done, not joined
        close(job.result(TIMEOUT_S), offline[1])
        assert joins.snapshot() == [threading.current_thread().name]
    finally:
        worker.stop()


def test_bad_codes_are_refused_at_submit_and_touch_no_round(codec, streams):
    worker = make(codec)
    try:
        with pytest.raises(ChildError) as bad:
            worker.submit(1, np.full((2, 12), 5000), start=True, end=False)
        assert bad.value.kind is ErrorKind.INVALID_ARGUMENT and "[0, " in str(bad.value)
        with pytest.raises(ChildError):
            worker.submit(1, np.zeros((2, 11), np.int64), start=True, end=False)
        assert worker.stats().jobs == 0 and 1 not in worker.sessions
    finally:
        worker.stop()


def test_a_stream_without_state_fails_alone(codec, streams, offline):
    worker = make(codec)
    try:
        lost = worker.submit("never-started", streams[0, :2], start=False, end=False)
        fine = worker.submit("ok", streams[1, :2], start=True, end=True)
        with pytest.raises(ChildError) as err:
            lost.result(TIMEOUT_S)
        assert "no codec state" in str(err.value)
        close(fine.result(TIMEOUT_S), offline[1][:, :2 * SPF][:, :])  # prefix of a causal decode
    finally:
        worker.stop()


def test_a_full_state_refuses_the_new_stream_with_unavailable(codec, streams):
    worker = make(codec, max_slots=1)
    try:
        worker.submit("a", streams[0, :2], start=True, end=False).result(TIMEOUT_S)
        refused = worker.submit("b", streams[1, :2], start=True, end=False)
        after = worker.submit("b", streams[1, 2:4], start=False, end=False)
        for job in (refused, after):
            with pytest.raises(ChildError) as err:
                job.result(TIMEOUT_S)
            assert err.value.kind is ErrorKind.UNAVAILABLE
        # A chunk the stream sent before it saw the refusal fails the same way, until its END.
        late = worker.submit("b", streams[1, 4:6], start=False, end=False)
        with pytest.raises(ChildError) as err:
            late.result(TIMEOUT_S)
        assert err.value.kind is ErrorKind.UNAVAILABLE and "slots" in str(err.value)
        assert worker.submit("b", np.zeros((0, 12), np.int64), start=False, end=True).result(TIMEOUT_S).shape == (2, 0)
        assert "b" not in worker._failed
        assert worker.sessions.stats().active_slots == 1
    finally:
        worker.stop()


def test_a_decode_failure_fails_its_round_and_the_rest_of_those_streams(codec, streams):
    with gated(codec) as (worker, gate):
        worker.submit(1, streams[0, :2], start=True, end=False)
        assert gate.entered.wait(TIMEOUT_S)
        later = worker.submit(1, streams[0, 2:4], start=False, end=False)
        end = worker.submit(1, np.zeros((0, 12), np.int64), start=False, end=True)
        gate.decode = lambda chunks, checked: (_ for _ in ()).throw(RuntimeError("simulated device failure"))
        gate.release.set()
        for job in (later, end):
            with pytest.raises(ChildError) as err:
                job.result(TIMEOUT_S)
            assert err.value.kind is ErrorKind.INTERNAL and "simulated device failure" in str(err.value)
        assert worker.sessions.stats().active_slots == 0
        gate.decode = worker.sessions.__class__.decode_async.__get__(worker.sessions)  # healthy again
        ok = worker.submit(2, streams[1, :2], start=True, end=True)
        assert ok.result(TIMEOUT_S).shape == (2, 2 * SPF)


def test_cancelled_jobs_are_dropped_and_their_end_still_frees_the_slot(codec, streams):
    with gated(codec) as (worker, gate):
        worker.submit(1, streams[0, :2], start=True, end=False)
        assert gate.entered.wait(TIMEOUT_S)
        dropped = [worker.submit(1, streams[0, a:a + 2], start=False, end=False) for a in (2, 4)]
        for job in dropped:
            job.cancel()
        end = worker.submit(1, np.zeros((0, 12), np.int64), start=False, end=True)
        offline = worker.submit(2, streams[1], start=True, end=True)
        offline.cancel()  # a cancelled START|END job ends its sequence when it is dropped
        gate.release.set()
        assert end.result(TIMEOUT_S).shape == (2, 0)
        for job in dropped:
            with pytest.raises(ChildError) as err:
                job.result(TIMEOUT_S)
            assert err.value.kind is ErrorKind.CANCELLED
        assert gate.rounds.snapshot() == [{1: 2}]  # nothing cancelled was decoded
        assert worker.sessions.stats().active_slots == 0


def test_stop_fails_what_is_queued_with_unavailable_and_refuses_more(codec, streams):
    worker = make(codec)
    gate = Gate(worker.sessions)
    worker.submit(1, streams[0, :2], start=True, end=False)
    assert gate.entered.wait(TIMEOUT_S)
    queued = worker.submit(1, streams[0, 2:4], start=False, end=False)
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    gate.release.set()
    stopper.join(TIMEOUT_S)
    with pytest.raises(ChildError) as err:
        queued.result(TIMEOUT_S)
    assert err.value.kind is ErrorKind.UNAVAILABLE
    with pytest.raises(ChildError):
        worker.submit(3, streams[0, :2], start=True, end=False)


def test_placement_parameters():
    assert VocoderPlacement.from_parameters({}).is_in_process
    placement = VocoderPlacement.from_parameters({"vocoder": "bls", "vocoder_slots": "8", "max_streams": "9"})
    assert (placement.vocoder, placement.vocoder_slots, placement.is_in_process) == ("bls", 8, False)
    assert VocoderPlacement.from_parameters({}).vocoder_fusion == "ln_lt_gelu"
    assert VocoderPlacement.from_parameters({"vocoder_fusion": "gelu"}).vocoder_fusion == "gelu"
    assert VocoderPlacement.from_parameters({}).vocoder_stream == "own"
    assert VocoderPlacement.from_parameters({"vocoder_stream": "engine"}).vocoder_stream == "engine"
    with pytest.raises(ValueError, match="vocoder_stream must be one of own, engine"):
        VocoderPlacement.from_parameters({"vocoder_stream": "shared"})
    assert VocoderPlacement.from_parameters({}).vocoder_ring_kernel == "split"  # served until fused is measured
    assert VocoderPlacement.from_parameters({"vocoder_ring_kernel": "fused"}).vocoder_ring_kernel == "fused"
    with pytest.raises(ValueError, match="vocoder_ring_kernel must be one of split, fused"):
        VocoderPlacement.from_parameters({"vocoder_ring_kernel": "one"})
    for bad in ({"vocoder": "gpu"}, {"vocoder_slots": "-1"}, {"vocoder_step_rows": "x"}, {"vocoder_fusion": "all"}):
        with pytest.raises(ValueError):
            VocoderPlacement.from_parameters(bad)


def test_the_vocoder_models_fusion_parameter():
    """The vocoder model (vocoder=bls layouts) serves the in-process vocoder's default unless told."""
    assert codec_fusion({}) == VocoderPlacement.from_parameters({}).vocoder_fusion == "ln_lt_gelu"
    assert codec_fusion({"fusion": "none"}) == "none"
    with pytest.raises(ValueError, match="vocoder parameter fusion must be one of"):
        codec_fusion({"fusion": "fast"})


def test_the_vocoder_models_ring_kernel_parameter():
    """Like fusion: the in-process vocoder's default unless told, checked at load."""
    assert codec_ring_kernel({}) == VocoderPlacement.from_parameters({}).vocoder_ring_kernel == "split"
    assert codec_ring_kernel({"ring_kernel": "fused"}) == "fused"
    with pytest.raises(ValueError, match="vocoder parameter ring_kernel must be one of split, fused"):
        codec_ring_kernel({"ring_kernel": "both"})


@pytest.mark.gpu
@pytest.mark.parametrize("shared", [False, True], ids=["own_stream", "engine_stream"])
def test_on_the_gpu_in_flight_chunks_through_graphs_equal_offline(tiny_dir, streams, shared):
    """The worker's CUDA stream (its own, or, vocoder_stream "engine", the one another thread
    runs on), graphs, START resets on that stream, while another thread keeps the GPU busy on a
    high-priority stream (the engine's place): streamed == offline."""
    codec = load_codec(tiny_dir / "codec", torch.device("cuda"), torch.float32).eval()
    sessions = VocoderSessions(codec, VocoderConfig(max_slots=4, max_public_sessions=4, device="cuda",
                                                    cuda_graphs=True, max_step_rows=4))
    busy, stop = torch.cuda.Stream(priority=-1), threading.Event()
    worker = VocoderWorker(sessions, stream=busy if shared else None)
    assert (worker._stream is busy) == shared

    def load():
        x = torch.randn(2048, 2048, device="cuda")
        with torch.cuda.stream(busy):
            while not stop.is_set():
                x = (x @ x).tanh_()
                busy.synchronize()

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        cuts = [0, 2, 6, 14, 24, 30]
        for rep in range(2):  # the second time every slot was used before: START must reset it
            jobs = {seq: [worker.submit(seq, streams[seq, a:b], start=a == 0, end=b == 30)
                          for a, b in zip(cuts, cuts[1:])] for seq in range(3)}
            with torch.inference_mode():
                offline = codec.decode(torch.from_numpy(streams).cuda()).float().cpu().numpy()
            for seq, seq_jobs in jobs.items():
                audio = np.concatenate([job.result(TIMEOUT_S) for job in seq_jobs], axis=-1)
                peak = np.abs(offline[seq]).max()
                assert np.abs(audio - offline[seq]).max() <= 1e-4 * peak, (rep, seq)
        stats = worker.stats()
        assert stats.graph_calls == stats.decode_calls > 0 and stats.active_slots == 0
    finally:
        stop.set()
        loader.join(10)
        worker.stop()


def test_released_slots_are_reset_together_when_the_clean_ones_run_out_and_a_full_state_refuses_only_the_rest(
        codec, streams):
    with gated(codec, max_slots=3) as (worker, gate):
        state, calls = worker.sessions.state, SharedList()  # reset_rows runs on the worker thread
        reset = state.reset_rows
        state.reset_rows = lambda rows: (calls.append(sorted(rows)), reset(rows))
        worker.submit("a", streams[0, :2], start=True, end=False)
        assert gate.entered.wait(TIMEOUT_S)
        jobs = {seq: worker.submit(seq, streams[i, :2], start=True, end=True) for i, seq in enumerate("bcd")}
        gate.release.set()
        assert jobs["b"].result(TIMEOUT_S).shape == jobs["c"].result(TIMEOUT_S).shape == (2, 2 * SPF)
        with pytest.raises(ChildError) as err:
            jobs["d"].result(TIMEOUT_S)
        assert err.value.kind is ErrorKind.UNAVAILABLE and "slots" in str(err.value)
        # Every slot was zeroed when the sessions were made: the STARTs take clean slots, no reset.
        assert calls.snapshot() == []
        # b and c ended: their slots are dirty until the clean ones run out (a holds slot 0).
        again = {seq: worker.submit(seq, streams[i, :2], start=True, end=True) for i, seq in enumerate("ef")}
        assert again["e"].result(TIMEOUT_S).shape == again["f"].result(TIMEOUT_S).shape == (2, 2 * SPF)
        assert calls.snapshot() == [[1, 2]]  # one reset for both released slots


def test_a_round_takes_the_most_urgent_streams_first_up_to_round_rows(codec, streams):
    with gated(codec, max_slots=4, round_rows=2) as (worker, gate):
        worker.submit("warm", streams[0, :2], start=True, end=True)
        assert gate.entered.wait(TIMEOUT_S)
        # Queued behind round 1: three new streams due at different times.
        jobs = {seq: worker.submit(seq, streams[i, :2], start=True, end=True, deadline=due)
                for i, (seq, due) in enumerate((("late", 30.0), ("soon", 10.0), ("sooner", 5.0)))}
        gate.release.set()
        for job in jobs.values():
            job.result(TIMEOUT_S)
        assert [sorted(r) for r in gate.rounds.snapshot()] == [["warm"], ["soon", "sooner"], ["late"]]


def test_chunks_that_queued_up_decode_as_one_row(codec, streams, offline):
    with gated(codec) as (worker, gate):
        first = worker.submit(1, streams[0, :2], start=True, end=False)
        assert gate.entered.wait(TIMEOUT_S)
        queued = [worker.submit(1, streams[0, a:b], start=False, end=False) for a, b in ((2, 6), (6, 14), (14, 30))]
        end = worker.submit(1, np.zeros((0, 12), np.int64), start=False, end=True)
        gate.release.set()
        audio = np.concatenate([job.result(TIMEOUT_S) for job in [first, *queued]], axis=-1)
        close(audio, offline[0])
        assert [job.result(TIMEOUT_S).shape[1] for job in queued] == [4 * SPF, 8 * SPF, 16 * SPF]
        # Round 2: 4 + 6 of the next 8 frames in one 10-frame row; then 2 + 8, then the last 8.
        assert gate.rounds.snapshot() == [{1: 2}, {1: 10}, {1: 10}, {1: 8}]
        assert end.result(TIMEOUT_S).shape == (2, 0) and 1 not in worker.sessions


def test_the_next_round_is_launched_before_the_last_one_lands(codec, streams, offline):
    """Rounds overlap: with a stream's next chunk waiting, the worker launches it before it waits
    for the previous round's audio (the GPU decodes while the host hands audio out), and the
    audio still equals offline decode."""
    events: list[str] = []

    class Recorded:
        def __init__(self, pending, k):
            self.pending, self.k = pending, k

        def wait(self):
            events.append(f"land {self.k}")
            return self.pending.wait()

    with gated(codec) as (worker, gate):
        launch = gate.decode

        def recorded_launch(chunks, checked=False):
            k = sum(e.startswith("launch") for e in events) + 1
            events.append(f"launch {k}")
            return Recorded(launch(chunks, checked), k)

        gate.decode = recorded_launch
        first = worker.submit(0, streams[0, :2], start=True, end=False)
        assert gate.entered.wait(TIMEOUT_S)  # round 1 is being launched: queue the next chunk
        second = worker.submit(0, streams[0, 2:6], start=False, end=True)
        gate.release.set()
        audio = np.concatenate([first.result(TIMEOUT_S), second.result(TIMEOUT_S)], axis=-1)
    assert events == ["launch 1", "launch 2", "land 1", "land 2"]
    close(audio, offline[0][:, :6 * SPF])
    assert worker.stats().active_slots == 0


def test_hold_until_keeps_a_small_round_back_only_while_none_of_it_is_due():
    from collections import deque

    from moss_tts.vocoder.jobs import VocodeJob, hold_until

    def job(seq, frames, deadline, start=False, end=False):
        return VocodeJob(seq, np.zeros((frames, 12), np.int64), start, end, lambda: None, deadline)

    a, b = job("a", 4, 10.0), job("b", 2, 10.5)
    queues = {"a": deque([a]), "b": deque([b])}
    picks = [[(a, 4)], [(b, 2)]]
    assert hold_until(picks, queues, now=9.0, min_frames=8, slack_s=0.25) == pytest.approx(9.75)  # a's, less slack
    assert hold_until(picks, queues, now=9.8, min_frames=8, slack_s=0.25) is None  # a is due within the slack
    assert hold_until(picks, queues, now=9.0, min_frames=6, slack_s=0.25) is None  # enough frames
    assert hold_until(picks, queues, now=9.0, min_frames=0, slack_s=0.25) is None  # holding is off
    queues["b"].append(job("b", 0, 11.0, end=True))
    assert hold_until(picks, queues, now=9.0, min_frames=8, slack_s=0.25) is None  # b's stream is ending
    alone = job("c", 0, 12.0, end=True)
    assert hold_until([[(alone, 0)]], {"c": deque([alone])}, now=9.0, min_frames=8, slack_s=0.25) is None


def test_under_load_a_small_round_waits_for_its_floor_even_when_due_now():
    from collections import deque

    from moss_tts.vocoder.jobs import LoadHold, VocodeJob, hold_until

    first = VocodeJob("a", np.zeros((2, 12), np.int64), True, False, lambda: None, 9.0)  # a first chunk: due now
    later = VocodeJob("b", np.zeros((4, 12), np.int64), False, False, lambda: None, 20.0)
    first.waiting_since, later.waiting_since = 8.99, 8.995
    queues, picks = {"a": deque([first]), "b": deque([later])}, [[(first, 2)], [(later, 4)]]
    hold = LoadHold(streams=2, seconds=0.02)
    floor = hold.floor(picks, num_open=2)
    assert floor == pytest.approx(9.01)  # the oldest job's queueing + 20 ms
    assert hold_until(picks, queues, now=9.0, min_frames=8, slack_s=0.25, floor=floor) == pytest.approx(9.01)
    assert hold_until(picks, queues, now=9.0, min_frames=8, slack_s=0.25) is None  # without it: at once
    assert hold_until(picks, queues, now=9.011, min_frames=8, slack_s=0.25, floor=floor) is None  # waited enough
    assert hold_until(picks, queues, now=9.0, min_frames=6, slack_s=0.25, floor=floor) is None  # large enough
    queues["b"].append(VocodeJob("b", np.zeros((0, 12), np.int64), False, True, lambda: None, 9.0))
    assert hold_until(picks, queues, now=9.0, min_frames=8, slack_s=0.25, floor=floor) == pytest.approx(9.01)
    assert hold.floor(picks, num_open=1) == 0.0  # below the load: one stream's first audio is untouched
    assert LoadHold(streams=2, seconds=0.0).floor(picks, num_open=9) == 0.0  # off
    assert hold.floor([], num_open=9) == 0.0


def test_a_loaded_worker_holds_a_first_chunk_for_the_load_hold_only(codec, streams):
    import time as clock

    from moss_tts.vocoder.jobs import LoadHold

    worker = make(codec, min_round_frames=100, hold_slack_s=0.05, load_hold=LoadHold(streams=2, seconds=0.3))
    try:
        for seq in (0, 1):  # 0, then 1 open sequence: not loaded
            asked = clock.monotonic()
            alone = worker.submit(seq, streams[seq, :2], start=True, end=False)
            assert alone.wait(TIMEOUT_S) and clock.monotonic() - asked < 0.25
        asked = clock.monotonic()
        held = worker.submit(2, streams[2, :2], start=True, end=False)  # two open: loaded
        assert not held.wait(0.15)  # due now, yet held for the load hold
        assert held.wait(TIMEOUT_S) and clock.monotonic() - asked >= 0.28
        assert clock.monotonic() - asked < 3.0
    finally:
        worker.stop()


def test_the_load_hold_counts_from_each_piece_not_from_the_submit(codec, streams):
    """A job longer than a round's piece goes out in pieces: what is left of it waits the hold
    anew after each one. Counted from the submit, every piece after the first went at once."""
    import time as clock

    from moss_tts.vocoder.jobs import LoadHold

    worker = make(codec, piece_frames=4, min_round_frames=100, hold_slack_s=0.05,
                  load_hold=LoadHold(streams=1, seconds=0.3))
    try:
        asked = clock.monotonic()
        job = worker.submit(0, streams[0, :10], start=True, end=False)  # pieces of 4, 4, 2
        # The first piece goes at once (no sequence open yet: not loaded); the two after it wait
        # 0.3 s each from the launch of the one before.
        assert job.wait(TIMEOUT_S) and clock.monotonic() - asked >= 0.58
        assert job.result().shape == (2, 10 * SPF)
    finally:
        worker.stop()


def test_a_small_round_waits_until_due_or_until_an_end_comes(codec, streams, offline):
    import time as clock

    worker = make(codec, min_round_frames=100, hold_slack_s=0.05)
    try:
        first = worker.submit(0, streams[0, :2], start=True, end=False)  # due now: decoded at once
        assert first.wait(TIMEOUT_S)
        later = worker.submit(0, streams[0, 2:6], start=False, end=False, deadline=clock.monotonic() + 1.5)
        assert not later.wait(0.1)  # 4 frames due in 1.5 s: held (until 1.45 s)
        asked = clock.monotonic()
        due = worker.submit(1, streams[1, :3], start=True, end=False, deadline=asked + 0.2)
        # A chunk due sooner wakes the worker; the round (both streams' chunks) is due at 0.15 s.
        # Unwoken, the holding worker would look again only after its 1 s cap (~0.9 s from here).
        assert due.wait(TIMEOUT_S) and later.wait(TIMEOUT_S) and clock.monotonic() - asked < 0.6
        last = worker.submit(0, streams[0, 6:10], start=False, end=False, deadline=clock.monotonic() + 5)
        assert not last.wait(0.4)  # held again
        asked = clock.monotonic()
        end = worker.submit(0, np.zeros((0, 12), np.int64), start=False, end=True, deadline=asked + 9)
        assert last.wait(TIMEOUT_S) and end.wait(TIMEOUT_S)  # stream 0 ends: nothing of it waits
        assert clock.monotonic() - asked < 4.0  # long before its 4.95 s
        close(np.concatenate([first.result(), later.result(), last.result()], axis=-1), offline[0, :, :10 * SPF])
    finally:
        worker.stop()


def test_vocoder_hold_parameters_are_validated():
    with pytest.raises(ValueError, match="vocoder_round_min_frames"):
        VocoderPlacement.from_parameters({"vocoder_round_min_frames": "-1"})
    with pytest.raises(ValueError, match="vocoder_load_hold_ms"):
        VocoderPlacement.from_parameters({"vocoder_load_hold_ms": "-5"})
    # stream_turn was removed (measured slower); a config that still sets it loads as before.
    assert VocoderPlacement.from_parameters({"stream_turn": "false", "vocoder_hold_ms": "100"}).vocoder_hold_ms == 100


def test_a_hurried_job_is_not_held(codec, streams):
    import time as clock

    worker = make(codec, min_round_frames=100, hold_slack_s=0.05)
    try:
        assert worker.submit(0, streams[0, :2], start=True, end=False).wait(TIMEOUT_S)
        held = worker.submit(0, streams[0, 2:6], start=False, end=False, deadline=clock.monotonic() + 5)
        assert not held.wait(0.4)
        asked = clock.monotonic()
        held.hurry()  # its stream waits for it (a text session's sentence ends without END)
        assert held.wait(TIMEOUT_S) and clock.monotonic() - asked < 3.0  # not at 4.95 s
    finally:
        worker.stop()


def test_each_round_that_starts_a_sequence_is_posted_once(codec, streams):
    """The engine's first-audio gate hears of every round carrying a START's first frames, and of
    no other round (None: no CUDA event on the CPU)."""
    worker = make(codec)
    posted = SharedList()  # round_launched runs on the worker thread
    worker.first_audio_gate = SimpleNamespace(wanted=True, round_launched=posted.append)
    try:
        first = [worker.submit(seq, streams[seq, :2], start=True, end=False) for seq in range(2)]
        for job in first:
            job.result(TIMEOUT_S)
        rounds = worker.stats().rounds
        assert 1 <= len(posted.snapshot()) <= rounds and set(posted.snapshot()) == {None}
        before = len(posted.snapshot())
        for seq in range(2):  # later chunks and the ENDs: no START, nothing posted
            worker.submit(seq, streams[seq, 2:6], start=False, end=False).result(TIMEOUT_S)
            worker.submit(seq, np.zeros((0, 12), np.int64), start=False, end=True).result(TIMEOUT_S)
        assert len(posted.snapshot()) == before
    finally:
        worker.stop()



def test_no_round_is_posted_while_the_gate_is_not_wanted(codec, streams):
    """Under load the engine never holds: the worker then records no event and posts nothing."""
    worker = make(codec)
    posted = SharedList()
    worker.first_audio_gate = SimpleNamespace(wanted=False, round_launched=posted.append)
    try:
        worker.submit(0, streams[0, :2], start=True, end=False).result(TIMEOUT_S)
        worker.submit(0, np.zeros((0, 12), np.int64), start=False, end=True).result(TIMEOUT_S)
        assert posted.snapshot() == []
    finally:
        worker.stop()


def test_a_job_wakes_every_waiter_once_done_and_times_out_before():
    """VocodeJob's done signal (a flag and a held lock, not a threading.Event): waiting times out
    while the job runs; once it finishes every waiter, blocked or late, returns with its audio, an
    error reaches each of them, and a second finish changes nothing."""
    from moss_tts.vocoder.jobs import VocodeJob

    job = VocodeJob("s", np.zeros((2, 12), np.int64), True, False, lambda: None, 0.0)
    assert not job.done() and not job.wait(0.01) and not job.wait(0)
    with pytest.raises(ChildError, match="did not answer"):
        job.result(timeout=0.01)
    got = SharedList()
    # result() without a timeout: a waiter not let through blocks, and the join below says so
    waiters = [threading.Thread(target=lambda: got.append(job.result().shape), daemon=True) for _ in range(4)]
    for t in waiters:
        t.start()
    time.sleep(0.05)  # most are blocked on the latch by now
    audio = np.ones((2, 8), np.float32)
    job._finish([audio], None)
    job._finish([np.zeros((2, 3), np.float32)], None)  # ignored: the first finish stands
    for t in waiters:
        t.join(5)
    assert not any(t.is_alive() for t in waiters), "a waiter was never let through"
    assert got.snapshot() == [(2, 8)] * 4
    assert job.done() and job.wait() and job.wait(0) and job.result(0).shape == (2, 8)

    failed = VocodeJob("t", np.zeros((2, 12), np.int64), True, False, lambda: None, 0.0)
    failed._finish(None, ChildError("boom", ErrorKind.INTERNAL))
    for _ in range(2):
        with pytest.raises(ChildError, match="boom"):
            failed.result(0)
