"""A wave of new streams in the moss_tts stub, on the CPU, with the real stream side (issue 34).

    PYTHONPATH=python_backends:. python3 perf/bench_wave.py [--streams 256] [--frames 112] [--reps 3] [--out x.json]

At the start of a 256-stream wave the H200's engine steps were host-bound (round 13: 44 ms steps of
18 ms GPU work; round 14: host 10-18 ms a step while a wave was admitted, 3-4 between) and 8-37% of
the streams' second chunks ran dry. The engine thread waits to win the GIL back from the stream
threads, which all start, tokenize, submit and take their first chunks at once. This runs that
wave with the stub's real stream side and a model of the rest, no Triton and no GPU:
- real: each stream's thread (SpeechStream over EngineCodes, EngineStreams and CodesFeed), the
  prompt build (PromptBuilder, the tiny checkpoint's tokenizer), the engine request's caller work
  (RequestState.create), the engine's event delivery (HostTurn, as served: 4 ms, and the widened
  delivery where the tree has it), the vocoder's worker thread (VocoderWorker: jobs, rounds,
  completion, wake-ups);
- modelled: the engine thread's step (`--launch-calls` GIL hand-offs as torch calls make, then
  `--apply-ms` of Python, then the device for `--device-ms` with the GIL released), the codec's
  rounds (a sleep of `--round-ms` + `--round-us-per-frame`, the GIL released) and each response's
  send and cancel check (an IPC round trip: the GIL given up and won back).
Reported per run: the engine thread's host time a step (launch + apply, what the stream threads
delay) over the wave's first `--wave-steps` steps and over the rest, the delivery's time a step,
first audio p50 / p95 (from the wave's start), and the streams whose audio ran dry (a chunk sent
after the audio before it, counted from the first chunk's send at 80 ms a frame, had played out),
by chunk. Run it from two trees (PYTHONPATH) to compare them: the model stays the same;
`--forward-chunks` runs the streams with vocoder_forward_chunks on.
"""

from __future__ import annotations

import argparse
import gc
import json
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from moss_tts.engine.config import EngineConfig
from moss_tts.engine.events import CodesChunk, Finished
from moss_tts.engine.host_turn import HostTurn
from moss_tts.engine.request import RequestState, chunk_target
from moss_tts.model.config import MossTTSConfig
from moss_tts.model.loading import load_tokenizer
from moss_tts.model.processor import PromptBuilder
from moss_tts.pipeline.engine_codes import EngineCodes
from moss_tts.pipeline.engine_streams import EngineStreams
from moss_tts.pipeline.playback import FRAME_S
from moss_tts.pipeline.speech_stream import SpeechStream
from moss_tts.pipeline.synthesis_request import parse_synthesis_request
from moss_tts.vocoder.worker import VocoderWorker
from perf.bench_host_turn import SERVED_SWITCH_INTERVAL_S, spin

SERVED_FIRST_CHUNK_FRAMES, SERVED_CHUNK_FRAMES = 2, 25  # model_repository/moss_tts/config.pbtxt
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest."  # bench_triton's


def chunk_ends(frames: int) -> list[int]:
    """The frame counts at which a request's chunks leave, by the engine's rule (request.chunk_target)."""
    ends = [0]
    while ends[-1] < frames:
        ends.append(min(frames, ends[-1] + chunk_target(ends[-1], SERVED_FIRST_CHUNK_FRAMES, SERVED_CHUNK_FRAMES)))
    return ends[1:]


class ModelEngine:
    """The engine thread's shape: admit what was submitted, a launch of GIL hand-offs, the apply's
    Python, chunk and Finished events posted through the real HostTurn, the device as a sleep."""

    def __init__(self, on_event, args) -> None:
        self.args = args
        try:
            self.host_turn = HostTurn(on_event, 4e-3, args.deliver_us / 1e6)
        except TypeError:  # a tree before the widened delivery
            self.host_turn = HostTurn(on_event, 4e-3)
        self.config = SimpleNamespace(max_seq_len=4096)
        self._config = EngineConfig()
        self._new: "queue.SimpleQueue" = queue.SimpleQueue()
        self._aborted: set = set()
        self.host, self.gives = [], []
        self.thread = threading.Thread(target=self._loop, name="model-engine", daemon=True)
        self.started = 0.0
        self.done = threading.Event()

    def submit(self, request) -> None:
        RequestState.create(request, self._config)  # the caller's part of Engine.submit (block names, params)
        self._new.put(request.request_id)

    def abort(self, request_id: str) -> bool:
        self._aborted.add(request_id)
        return True

    def start(self) -> None:
        self.thread.start()

    def stalled_seconds(self) -> float:
        return 0.0

    def _loop(self) -> None:
        a, ends = self.args, chunk_ends(self.args.frames)
        running: dict[str, list] = {}  # request id -> [frames, next chunk index]
        finished = 0
        codes = {n: np.zeros((n, 12), np.int32) for n in set(np.diff([0, *ends]).tolist())}
        while finished < a.streams:
            self.host_turn.take()
            started = time.perf_counter()
            while True:
                try:
                    running[self._new.get_nowait()] = [0, 0]
                except queue.Empty:
                    break
            for _ in range(a.launch_calls):
                time.sleep(0)  # a torch call or graph replay gives the GIL up
            spin(a.apply_ms / 1e3)
            for rid in list(running):
                state = running[rid]
                if rid in self._aborted:
                    self.host_turn.post(Finished(rid, "cancelled", None, state[0]))
                    del running[rid]
                    finished += 1
                    continue
                state[0] += 1
                if state[0] == ends[state[1]]:
                    size = ends[state[1]] - (ends[state[1] - 1] if state[1] else 0)
                    self.host_turn.post(CodesChunk(rid, codes[size], state[0] - size))
                    state[1] += 1
                if state[0] == a.frames:
                    self.host_turn.post(Finished(rid, "max_frames", None, state[0]))
                    del running[rid]
                    finished += 1
            self.host.append(time.perf_counter() - started)
            gave = time.perf_counter()
            self.host_turn.give()
            self.gives.append(time.perf_counter() - gave)
            time.sleep(a.device_ms / 1e3)  # the device, GIL released
        self.host_turn.give()
        self.done.set()


class ModelSessions:
    """VocoderSessions' surface for the worker, the codec's rounds a sleep with the GIL released."""

    def __init__(self, args) -> None:
        self.args = args
        self.config = SimpleNamespace(torch_device=torch.device("cpu"), max_graph_frames=10)
        self.step_rows = 128
        self._open: set = set()
        self._lock = threading.Lock()

    def check(self, seq, codes):
        if codes.ndim != 2 or codes.shape[1] != 12 or (codes.size and (codes.min() < 0 or codes.max() >= 1024)):
            raise ValueError("bad codes")  # the real check's numpy work
        return codes

    def start_many(self, seqs):
        with self._lock:
            self._open.update(seqs)
        return {s: None for s in seqs}

    def end(self, seq):
        with self._lock:
            self._open.discard(seq)

    cancel = end

    def __contains__(self, seq) -> bool:
        with self._lock:
            return seq in self._open

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def expire(self, idle_seconds) -> None:
        pass

    def decode_async(self, pieces, checked=False):
        frames = sum(p.shape[0] for p in pieces.values())
        seconds = (self.args.round_ms + frames * self.args.round_us_per_frame / 1e3) / 1e3
        return SimpleNamespace(wait=lambda: (time.sleep(seconds),
                                             {s: np.zeros((2, p.shape[0] * 3840), np.float32) for s, p in pieces.items()})[1])


class Children:
    """TritonChildren's in-process half: the engine's chunks, the worker's jobs."""

    def __init__(self, codes: EngineCodes, worker: VocoderWorker, seq: int) -> None:
        self.codes, self.worker, self.seq = codes, worker, seq

    def stream_codes(self):
        return self.codes.chunks()

    def abort_codes(self):
        self.codes.abort()

    def forward_chunks(self, forward):  # as TritonChildren's (chunk_forwarder.py), where the tree has it
        self.codes.forward = forward
        return self.codes.wake

    def vocode(self, codes, start, end, deadline=None):
        return self.worker.submit(self.seq, codes, start, end, on_done=self.codes.wake, deadline=deadline)


class Client:
    """Sends and cancel checks as IPC round trips (the GIL given up); records each audio send."""

    def __init__(self, t0: float) -> None:
        self.t0, self.sends, self.finals, self.errors = t0, [], 0, []

    def send(self, audio, codes, context, final):
        time.sleep(0)
        if codes is not None and codes.shape[0]:
            self.sends.append((time.monotonic() - self.t0, codes.shape[0]))
        self.finals += final

    def send_error(self, message, kind):
        self.errors.append(message)
        self.finals += 1

    def send_final(self):
        time.sleep(0)
        self.finals += 1

    def is_cancelled(self):
        time.sleep(0)
        return False


def dry_chunks(sends: list[tuple[float, int]]) -> list[int]:
    """The chunks (1-based) sent after the audio before them had played out."""
    late, first, played = [], sends[0][0], 0
    for k, (at, frames) in enumerate(sends):
        if k and at > first + played * FRAME_S:
            late.append(k + 1)
        played += frames
    return late


def run_once(args, builder: PromptBuilder) -> dict:
    engine_box = {}

    def factory(on_event):
        engine_box["engine"] = ModelEngine(on_event, args)
        return engine_box["engine"]

    streams = EngineStreams(factory)
    engine: ModelEngine = engine_box["engine"]
    worker = VocoderWorker(ModelSessions(args), round_rows=128, min_round_frames=64, hold_slack_s=0.02)
    inputs = {"TEXT": np.array([TEXT.encode()], dtype=object), "MAX_FRAMES": np.array([args.frames]),
              "IGNORE_STOP": np.array([True])}
    gate = threading.Barrier(args.streams + 1)
    clients = []

    def stream(i: int) -> None:
        client = Client(0.0)
        clients.append(client)  # list.append: one call, atomic
        synthesis = parse_synthesis_request(inputs.get, "").with_request_id(f"w{i}")
        gate.wait()
        client.t0 = t0[0]
        codes = EngineCodes(streams, builder, synthesis, lambda: None)
        forward = {"forward_chunks": True} if args.forward_chunks else {}
        SpeechStream(Children(codes, worker, i + 1), client, stream=True, wants_audio=True, **forward).run()

    t0 = [0.0]
    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(args.streams)]
    for t in threads:
        t.start()
    streams.start()
    t0[0] = time.monotonic()
    gate.wait()
    for t in threads:
        t.join(120)
    engine.done.wait(10)
    worker.stop()
    firsts = sorted(c.sends[0][0] * 1e3 for c in clients if c.sends)
    dry = [dry_chunks(c.sends) for c in clients if c.sends]
    by_chunk: dict[int, int] = {}
    for chunks in dry:
        for k in chunks:
            by_chunk[k] = by_chunk.get(k, 0) + 1
    host, w = engine.host, args.wave_steps
    return {"streams_ok": sum(c.finals == 1 and not c.errors for c in clients), "steps": len(host),
            "wave_host_ms_per_step": round(statistics.fmean(host[:w]) * 1e3, 2),
            "wave_host_ms_max": round(max(host[:w]) * 1e3, 2),
            "later_host_ms_per_step": round(statistics.fmean(host[w:]) * 1e3, 2) if len(host) > w else None,
            "wave_give_ms_per_step": round(statistics.fmean(engine.gives[:w]) * 1e3, 3),
            "first_audio_ms_p50": round(firsts[len(firsts) // 2], 1),
            "first_audio_ms_p95": round(firsts[int(len(firsts) * 0.95)], 1),
            "streams_run_dry": sum(bool(d) for d in dry), "run_dry_by_chunk": dict(sorted(by_chunk.items()))}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--frames", type=int, default=112)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--launch-calls", type=int, default=13)
    p.add_argument("--apply-ms", type=float, default=2.0)
    p.add_argument("--device-ms", type=float, default=15.0)
    p.add_argument("--round-ms", type=float, default=4.0)
    p.add_argument("--round-us-per-frame", type=float, default=40.0)
    p.add_argument("--deliver-us", type=int, default=1000, help="HostTurn's widened delivery, where the tree has it")
    p.add_argument("--wave-steps", type=int, default=20)
    p.add_argument("--forward-chunks", action="store_true", help="the engine hands chunks to the vocoder (chunk_forwarder.py)")
    p.add_argument("--checkpoint", type=Path, default=Path("checkpoints/tiny/model"))
    p.add_argument("--out")
    args = p.parse_args(argv)
    sys.setswitchinterval(SERVED_SWITCH_INTERVAL_S)
    cfg = MossTTSConfig.from_dict(json.loads((args.checkpoint / "config.json").read_text()), "tiny")
    builder = PromptBuilder(load_tokenizer(args.checkpoint), cfg)
    gc.collect()
    gc.freeze()  # as the stub does once loaded (serving/gc_watch.py): a full collection skips what is loaded
    runs = []
    try:
        for _ in range(args.reps):
            runs.append(run_once(args, builder))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        gc.unfreeze()  # the caller's process (a test's) collects as before
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "tree": str(Path(sys.modules["moss_tts"].__file__).parent),
              "runs": runs}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
