"""The engine's decode step beside the vocoder's rounds on one GPU: each alone, then together on two
CUDA streams (the served `vocoder_stream` "own": the engine's above the vocoder's) and on one
stream ("engine": the rounds between the steps), without Triton (issue 34, round 11).

    PYTHONPATH=python_backends:. python3 perf/bench_overlap.py --out overlap.json     # GPU, real size, ~2-3 min
    PYTHONPATH=python_backends:. python3 -m pytest tests/test_bench_overlap.py        # its loop, on fake work

Why: in round 11's steal-free soak the engine's step took ~23 ms of GPU beside the vocoder's
~119-frame rounds, against ~8 ms alone: ~77 µs of engine delay per decoded frame where a large
round alone costs ~35 µs a frame. This measures that cost without the server: does a small
round cost more interleaved with the engine's kernels than in turn, and from what round size
on does running them side by side pay?

Work (seeded random weights, bf16, the served forms):
  engine   one decode-step graph replay at --batch rows, KV lengths mid-generation as in
           bench_engine's steady state (reset every --reset-every steps, not timed)
  vocoder  one packed round (VocoderGraphs) of each --rounds ROWSxFRAMES shape, staged, replayed
           and its audio copied to pinned host memory at every call, as VocoderSessions does (the
           same codes, one step further on each time; rows pad to the graphs' buckets: 12 -> 16)
Each thread launches its work, records an event behind it and waits for it (the server keeps
one step or round queued ahead; this does not), and a mode runs --seconds. The engine's KV
lengths start over at each run and every --reset-every steps, on its lane, untimed. Per mode and work: ms per call (median,
mean), frames/s, and `share`: frames/s against the work alone. Together, engine share +
vocoder share is how much of the two alone the GPU did at once (1.0 = as good as in turn).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

MODES = ("alone", "two_streams", "one_stream")


@dataclass
class Work:
    """One kind of GPU work: `launch()` enqueues one call on the current stream; `frames` it makes."""
    name: str
    frames: int
    launch: Callable[[], None]
    # Untimed upkeep on the work's lane, before the first call of a run and then every `every`
    # calls (the engine's KV lengths back to their start: a run begins where the last one did not).
    between: Callable[[], None] = lambda: None
    every: int = 0


class Lane:
    """Where a thread runs its work: a CUDA stream, or (None) the CPU, synchronously."""

    def __init__(self, stream=None):
        self.stream = stream

    def call(self, launch: Callable[[], None]) -> None:
        if self.stream is None:
            launch()
            return
        import torch

        with torch.cuda.stream(self.stream):
            launch()
            done = torch.cuda.Event(blocking=True)  # the server's threads sleep on theirs too
            done.record(self.stream)
        done.synchronize()  # this call's work (and, on a shared stream, what was queued before it)


def run_lanes(jobs: list[tuple[Work, Lane]], seconds: float) -> dict[str, dict]:
    """Each (work, lane) on a thread of its own, calls back to back for `seconds`: per work, the
    timed calls' ms (median, mean) and frames/s over the time they took. A run's first call is
    not timed (first replays, pinned buffers); upkeep runs on the lane, untimed."""
    stop = threading.Event()
    times: dict[str, list[float]] = {work.name: [] for work, _ in jobs}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs))

    def loop(work: Work, lane: Lane) -> None:
        try:
            barrier.wait()
            n = 0
            while not stop.is_set():
                if work.every and n % work.every == 0:
                    lane.call(work.between)
                start = time.perf_counter()
                lane.call(work.launch)
                if n:
                    times[work.name].append(time.perf_counter() - start)  # one writer per list
                n += 1
        except BaseException as exc:  # reported below, the other thread stopped
            errors.append(exc)
            stop.set()
            barrier.abort()

    threads = [threading.Thread(target=loop, args=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    out = {}
    for work, _ in jobs:
        calls = times[work.name]
        if calls:
            out[work.name] = {"calls": len(calls), "ms_median": statistics.median(calls) * 1e3,
                              "ms_mean": statistics.fmean(calls) * 1e3,
                              "frames_per_s": work.frames * len(calls) / sum(calls)}
    return out


def compare(engine: Work, rounds: list[Work], lanes: Callable[[str], tuple[Lane, Lane]], seconds: float,
            run: Callable[[list[tuple[Work, Lane]], float], dict] = run_lanes) -> dict:
    """The engine alone, then per round shape: the round alone, both on two streams, both on one
    (each by `run`: run_lanes, or the tests' fixed rates)."""
    own_engine, own_vocoder = lanes("two_streams")
    alone = run([(engine, own_engine)], seconds)[engine.name]
    out = {"engine_alone": alone, "rounds": []}
    for vocoder in rounds:
        row = {"round": vocoder.name, "frames": vocoder.frames,
               "alone": run([(vocoder, own_vocoder)], seconds)[vocoder.name]}
        for mode in MODES[1:]:
            e_lane, v_lane = lanes(mode)
            both = run([(engine, e_lane), (vocoder, v_lane)], seconds)
            shares = {k: both[name]["frames_per_s"] / base["frames_per_s"]
                      for k, name, base in (("engine", engine.name, alone), ("vocoder", vocoder.name, row["alone"]))
                      if name in both}
            row[mode] = {**both, "engine_share": shares.get("engine"), "vocoder_share": shares.get("vocoder"),
                         "sum_of_shares": sum(shares.values())}
        out["rounds"].append(row)
    return out


def gpu_work(args) -> tuple[Work, list[Work], Callable[[str], tuple[Lane, Lane]]]:
    """The real-size engine and codec (seeded random, bf16), their graphs captured, and the lanes."""
    import torch

    from moss_tts.engine import EngineConfig
    from perf.bench_engine import Bench, build as build_model, steady_state
    from perf.bench_vocoder import Steps, build as build_codec, host_codes, random_codes

    model, _ = build_model(argparse.Namespace(tiny=False))
    max_seq_len = args.prompt_rows + 234  # bench_engine's: prompt + 112 frames + 122
    longest = args.prompt_rows + (args.batch - 1) * 112 // args.batch  # steady_state's longest slot
    if longest + args.reset_every + 1 > max_seq_len:
        raise SystemExit(f"--reset-every {args.reset_every}: the longest slot ({longest} rows) would pass "
                         f"max_seq_len {max_seq_len}; at most {max_seq_len - longest - 1}")
    config = EngineConfig(max_running_requests=args.batch, max_queue=1024, max_seq_len=max_seq_len,
                          prefill_chunk_tokens=8192)
    bench = Bench(model, config, 112, args.prompt_rows)
    runner = bench.engine._runner
    window = steady_state(bench, args.batch, args.reset_every + 1)[0]

    def reset_engine():
        runner.ctx.state.reset()
        steady_state(bench, args.batch, args.reset_every + 1)

    engine = Work("engine", args.batch, lambda: runner.graphs.replay_decode(args.batch, window),
                  reset_engine, args.reset_every)
    codec, device = build_codec(argparse.Namespace(device="cuda", tiny=False, fusion=args.fusion,
                                                   ring_kernel=args.ring_kernel))
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.rounds.split(",")]
    steps = Steps(codec, device, max(r for r, _ in shapes), max(f for _, f in shapes))
    steps.capture()
    rounds = []
    for rows, frames in shapes:
        slots, host = list(range(rows)), host_codes(random_codes(rows, frames, codec.codebook_size, 7))
        rounds.append(Work(f"vocoder_{rows}x{frames}", rows * frames, round_launch(steps, slots, host)))
    engine_stream = torch.cuda.Stream(device, priority=-1)  # engine/engine.py STREAM_PRIORITY
    vocoder_stream = torch.cuda.Stream(device)

    def lanes(mode: str) -> tuple[Lane, Lane]:
        return Lane(engine_stream), Lane(engine_stream if mode == "one_stream" else vocoder_stream)

    return engine, rounds, lanes


def round_launch(steps, slots: list[int], host: list) -> Callable[[], None]:
    """One served round: staged (host numpy, one pinned upload), replayed, and its audio copied
    into pinned host memory (VocoderSessions' download, ~4 MB a 1,000 frames: on a shared stream
    the next step waits behind it too)."""
    import torch

    pinned = {}

    def launch() -> None:
        audio = steps.graphs.replay(steps.graphs.stage(slots, host))
        if audio.numel() not in pinned:
            pinned[audio.numel()] = torch.empty(audio.numel(), dtype=audio.dtype, pin_memory=True)
        pinned[audio.numel()].copy_(audio.reshape(-1), non_blocking=True)

    return launch


def table(result: dict) -> str:
    e = result["engine_alone"]
    lines = [f"engine alone: {e['ms_median']:.2f} ms a step, {e['frames_per_s']:.0f} frames/s",
             "| round | frames | alone ms | mode | engine ms / step | round ms | engine share | vocoder share | sum |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in result["rounds"]:
        for mode in MODES[1:]:
            m = row[mode]
            ms = [f"{m[k]['ms_median']:.2f}" if k in m else "-" for k in ("engine", row["round"])]
            shares = [f"{m[k]:.2f}" if m.get(k) is not None else "-" for k in ("engine_share", "vocoder_share")]
            lines.append(f"| {row['round']} | {row['frames']} | {row['alone']['ms_median']:.2f} | {mode} | "
                         f"{ms[0]} | {ms[1]} | {shares[0]} | {shares[1]} | {m['sum_of_shares']:.2f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256, help="engine rows a step")
    ap.add_argument("--prompt-rows", type=int, default=150)
    ap.add_argument("--rounds", default="12x10,48x10,128x5", help="vocoder rounds, ROWSxFRAMES, comma-separated")
    ap.add_argument("--fusion", default=None, help="the codec's fusion (default: the served one)")
    ap.add_argument("--ring-kernel", default=None,
                    help="the codec's ring kernel, split or fused (default: the served one)")
    ap.add_argument("--seconds", type=float, default=4.0, help="per mode")
    ap.add_argument("--reset-every", type=int, default=100, help="engine steps between KV resets (untimed)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.fusion is None:
        from moss_tts.vocoder.config import DEFAULT_FUSION
        args.fusion = DEFAULT_FUSION
    if args.ring_kernel is None:
        from moss_tts.vocoder.config import DEFAULT_RING_KERNEL
        args.ring_kernel = DEFAULT_RING_KERNEL
    engine, rounds, lanes = gpu_work(args)
    result = {"args": vars(args) | {"out": str(args.out)}, **compare(engine, rounds, lanes, args.seconds)}
    print(table(result), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
