"""The vocoder's host path makes a fixed number of torch calls per round, however many sequences
the round decodes. In the moss_tts process nearly every torch call from Python gives the GIL
up and must win it back from ~256 stream threads and the engine (up to a switch interval each),
so a torch call per sequence per round costs milliseconds of vocoder time under load.

Counted with a TorchFunctionMode (torch functions, tensor methods and attributes) plus
torch.from_numpy (which bypasses modes), on the thread that runs each half of the work; the
codec's own decode step is not counted (on the GPU it is one graph replay). Tiny codec on CPU;
the graphs' padded static-buffer step runs uncaptured (capture=False); a GPU test (skipped
without CUDA) counts the captured graphs' path.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from moss_tts.codec import load_codec
from moss_tts.vocoder.config import VocoderConfig
from moss_tts.vocoder.sessions import VocoderSessions
from moss_tts.vocoder.worker import VocoderWorker

SPF = 3840  # samples per channel per codec frame
TIMEOUT_S = 60.0
MAX_ROWS = 64
_codec_depth = threading.local()  # > 0 on a thread inside the codec's decode step


class TorchCalls(TorchFunctionMode):
    """Counts the torch calls made on the thread that entered it, except inside the decode step."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not getattr(_codec_depth, "value", 0):
            self.names.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


@contextmanager
def counted(calls: TorchCalls):
    real = torch.from_numpy

    def from_numpy(array):
        calls.names.append("from_numpy")
        return real(array)

    torch.from_numpy = from_numpy  # a module attribute, looked up at each call
    try:
        with calls:
            yield calls
    finally:
        torch.from_numpy = real


class UncountedCodec:
    """The tiny codec whose decode step (the model itself) is left out of the counts."""

    def __init__(self, codec):
        self._codec = codec

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def decode_step_packed(self, codes, state, rows, packing):
        _codec_depth.value = getattr(_codec_depth, "value", 0) + 1
        try:
            return self._codec.decode_step_packed(codes, state, rows, packing)
        finally:
            _codec_depth.value -= 1


def assert_same_row(alone: np.ndarray, in_batch: np.ndarray) -> None:
    # Rows are independent; a CPU BLAS may block another row count differently: rounding only.
    peak = np.abs(alone).max()
    assert peak > 1e-3 and np.abs(alone - in_batch).max() <= 1e-5 * peak


@pytest.fixture(scope="module")
def codec(tiny_dir):
    return UncountedCodec(load_codec(tiny_dir / "codec"))


@pytest.fixture(scope="module")
def codes(codec) -> np.ndarray:
    """MAX_ROWS code streams [MAX_ROWS, 4, 12] (random codes, as the count does not look at them)."""
    return np.random.default_rng(0).integers(0, codec.codebook_size, (MAX_ROWS, 4, 12), dtype=np.int64)


def sessions_calls(codec, codes: np.ndarray, num_seqs: int, graphs: bool, device: str = "cpu") -> tuple[int, dict]:
    """Torch calls of one decode_async + wait() of num_seqs sequences (2 frames each), and the audio."""
    config = VocoderConfig(max_slots=MAX_ROWS, max_public_sessions=MAX_ROWS, cuda_graphs=graphs, device=device,
                           max_graph_frames=2)  # fewer graphs to capture on a GPU
    sessions = VocoderSessions(codec, config, capture=device != "cpu")
    sessions.start_many(list(range(num_seqs)))
    chunks = {seq: codes[seq, :2] for seq in range(num_seqs)}
    with counted(TorchCalls()) as calls:
        audio = sessions.decode_async(chunks).wait()
    assert sessions.stats().decode_calls == 1 and sessions.stats().graph_calls == int(graphs)
    return len(calls.names), audio


def worker_calls(codec, codes: np.ndarray, num_seqs: int) -> tuple[int, int, dict]:
    """Torch calls of num_seqs submits, and of the worker's rounds decoding them (START, 2 frames,
    END: one round), and the audio."""
    sessions = VocoderSessions(codec, VocoderConfig(max_slots=MAX_ROWS, max_public_sessions=MAX_ROWS,
                                                    cuda_graphs=True), capture=False)
    worker = VocoderWorker(sessions)
    on_worker: list[TorchCalls] = []

    def counting(step):
        def run(work):
            on_worker.append(TorchCalls())
            with counted(on_worker[-1]):
                return step(work)
        return run

    worker._launch, worker._land = counting(worker._launch), counting(worker._land)
    try:
        with worker._cond, counted(TorchCalls()) as on_streams:  # the worker takes them as one round
            jobs = {seq: worker.submit(seq, codes[seq, :2], start=True, end=True) for seq in range(num_seqs)}
        audio = {seq: job.result(TIMEOUT_S) for seq, job in jobs.items()}
        assert worker.stats().rounds == 1 and sessions.stats().decode_calls == 1
    finally:
        worker.stop()
    return len(on_streams.names), sum(len(c.names) for c in on_worker), audio


@pytest.mark.parametrize("graphs", [True, False])
def test_a_decode_call_makes_the_same_torch_calls_for_1_and_64_sequences(codec, codes, graphs):
    one, audio_one = sessions_calls(codec, codes, 1, graphs)
    many, audio_many = sessions_calls(codec, codes, MAX_ROWS, graphs)
    print(f"decode_async + wait, graphs={graphs}: {one} torch calls for 1 sequence, {many} for {MAX_ROWS}")
    assert many == one, f"{one} torch calls for 1 sequence but {many} for {MAX_ROWS}: a call per sequence is back"
    for audio in (audio_one, audio_many):
        assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (2, 2 * SPF)
                   for a in audio.values())
    assert_same_row(audio_one[0], audio_many[0])


@pytest.mark.gpu
def test_on_the_gpu_a_graphed_decode_call_makes_the_same_torch_calls_for_1_and_64_sequences(tiny_dir, codes):
    codec = UncountedCodec(load_codec(tiny_dir / "codec", torch.device("cuda"), torch.float32).eval())
    one, audio_one = sessions_calls(codec, codes, 1, True, "cuda")
    many, audio_many = sessions_calls(codec, codes, MAX_ROWS, True, "cuda")
    print(f"decode_async + wait, captured graphs on the GPU: {one} torch calls for 1 sequence, {many} for {MAX_ROWS}")
    assert many == one
    assert_same_row(audio_one[0], audio_many[0])


def test_a_worker_round_makes_the_same_torch_calls_for_1_and_64_sequences(codec, codes):
    submit_one, round_one, audio_one = worker_calls(codec, codes, 1)
    submit_many, round_many, audio_many = worker_calls(codec, codes, MAX_ROWS)
    print(f"worker: submit {submit_one} / {submit_many} torch calls, round {round_one} / {round_many} "
          f"for 1 / {MAX_ROWS} sequences")
    assert submit_one == submit_many == 0, "submit validates codes with numpy alone"
    assert round_many == round_one, f"a round of 1 sequence made {round_one} torch calls, of {MAX_ROWS} {round_many}"
    assert all(a.shape == (2, 2 * SPF) and a.dtype == np.float32 for a in audio_many.values())
    assert_same_row(audio_one[0], audio_many[0])
