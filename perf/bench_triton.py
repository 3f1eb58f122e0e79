"""End-to-end load on a running server: concurrent gRPC streams against `moss_tts`, per stream
time to first audio (TTFA), real-time factor (RTF) and underruns, and aggregate audio-s/s.

  .venv/bin/python -m perf.bench_triton --url localhost:8001 --concurrency 1,16,64,128,256 \
      --frames 112 --mode stream,offline --out results.json

Each level runs `concurrency` workers; each worker sends one utterance after another (112
frames = 8.96 s with IGNORE_STOP, the same text for every request, a different seed) until
`--requests` per worker are done. A stream's underruns: playback starts when its first audio
arrives; a chunk that arrives after the audio received before it has finished playing is one
underrun (the listener hears a gap), and the gap is added to the stall time. STREAM=false
requests (mode "offline") report TTFA = time to the whole utterance.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from moss_tts.contract import tensors as contract
from perf.cpu_sample import TICK, machine_ticks

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest."


@dataclass
class StreamResult:
    ttfa_s: float
    total_s: float
    audio_s: float
    underruns: int
    stall_s: float
    error: Optional[str] = None
    # (chunk index, gap s) of each underrun: 1 = the stream's second audio chunk (its first gap).
    gaps: tuple = ()

    @classmethod
    def played(cls, ttfa_s: float, total_s: float, audio_s: float,
               arrivals: list[tuple[float, float]]) -> "StreamResult":
        """A stream that got all its audio, its underruns from the arrivals (chunk_gaps): every
        client of the benches builds its results here, so each level's gaps agree with its counts."""
        gaps = chunk_gaps(arrivals)
        return cls(ttfa_s, total_s, audio_s, len(gaps), sum(g for _, g in gaps), gaps=tuple(gaps))

    @property
    def rtf(self) -> float:
        return self.total_s / self.audio_s if self.audio_s else float("inf")


def playback_gaps(arrivals: list[tuple[float, float]]) -> tuple[int, float]:
    """[(arrival time, audio seconds in that chunk)] in order -> (underruns, stalled seconds).
    Playback starts at the first arrival and plays continuously while audio is buffered."""
    gaps = chunk_gaps(arrivals)
    return len(gaps), sum(gap for _, gap in gaps)


def chunk_gaps(arrivals: list[tuple[float, float]]) -> list[tuple[int, float]]:
    """(index of the chunk that came late, the gap in s) of every underrun of playback_gaps."""
    if not arrivals:
        return []
    play_until = arrivals[0][0] + arrivals[0][1]
    gaps = []
    for index, (at, seconds) in enumerate(arrivals[1:], 1):
        if at > play_until + 1e-9:
            gaps.append((index, at - play_until))
            play_until = at
        play_until += seconds
    return gaps


def gaps_by_chunk(results: list[StreamResult], last: int = 8) -> dict:
    """Underruns by the chunk that came late ("1" = streams' second chunk, "8+" = the eighth on):
    {index: {"underruns", "stall_ms"}}. Which chunk runs dry says what to change: the second
    (its first is 2 frames, 160 ms of audio) waits on the engine's pace and the vocoder's next
    round, a later one on a stall."""
    out: dict = {}
    for r in results:
        for index, gap in r.gaps:
            key = str(index) if index < last else f"{last}+"
            entry = out.setdefault(key, {"underruns": 0, "stall_ms": 0.0})
            entry["underruns"] += 1
            entry["stall_ms"] = round(entry["stall_ms"] + gap * 1e3, 1)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0].rstrip("+"))))


@dataclass
class LevelReport:
    mode: str
    concurrency: int
    requests: int
    failures: int
    wall_s: float
    audio_s: float
    ttfa_ms: dict = field(default_factory=dict)  # p50 / p95 / p99 / max
    rtf: dict = field(default_factory=dict)  # p50 / p95 / max
    underruns: int = 0
    streams_with_underruns: int = 0
    stall_s: float = 0.0
    underruns_by_chunk: dict = field(default_factory=dict)  # gaps_by_chunk
    errors: list = field(default_factory=list)
    # Wall clock (time.time()) of the level's first request and last answer: perf/trace_phases.py
    # cuts the server's first-audio trace by them.
    wall_start: float = 0.0
    wall_end: float = 0.0
    # Client processes: how far apart they began sending (their imports and channels done), and
    # whether they waited for each other first (--start-together). The wall counts from the
    # first one's start, so a spread is time the server could not have served every stream.
    client_start_spread_s: float = 0.0
    start_together: bool = False
    # The machine's CPU over the level (its client processes included), in cores, from /proc/stat:
    # busy, and stolen by the hypervisor from the VM's vCPUs. Round 11 found the stub's host time a
    # step ~11 ms higher, and the frames/s ~20% lower, in soak windows with ~0.9 cores stolen:
    # a level that ran under steal is not a figure of the code alone (0.0: no /proc/stat).
    host_busy_cores: float = 0.0
    host_steal_cores: float = 0.0

    @property
    def audio_s_per_s(self) -> float:
        return self.audio_s / self.wall_s if self.wall_s else 0.0


def percentiles(values: list[float], which=(50, 95, 99)) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    out = {f"p{p}": ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] for p in which}
    out["max"] = ordered[-1]
    return out


async def one_stream(client, model: str, frames: int, seed: int, stream: bool, timeout_s: float) -> StreamResult:
    import tritonclient.grpc.aio as grpcclient

    from client.openai_shim.triton_stream import build_inputs, read_to_end

    inputs = build_inputs({"TEXT": TEXT, "MAX_FRAMES": frames, "IGNORE_STOP": True, "SEED": seed, "STREAM": stream})
    closed = asyncio.Event()

    async def requests():
        yield {"model_name": model, "inputs": inputs, "outputs": [grpcclient.InferRequestedOutput("AUDIO")],
               "parameters": {"triton_enable_empty_final_response": True}}
        await closed.wait()

    start = time.perf_counter()
    arrivals: list[tuple[float, float]] = []
    call = client.stream_infer(requests())
    try:
        while True:
            result, error = await asyncio.wait_for(call.__anext__(), timeout_s)
            now = time.perf_counter() - start
            if error is not None:
                await read_to_end(call, closed)  # ended: never cancelled (perf/hold_repro/README.md)
                return StreamResult(now, now, 0.0, 0, 0.0, error.message())
            audio = result.as_numpy("AUDIO")
            if audio is not None and audio.size:
                arrivals.append((now, audio.shape[1] / contract.SAMPLE_RATE))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    except asyncio.TimeoutError:
        call.cancel()
        now = time.perf_counter() - start
        return StreamResult(now, now, 0.0, 0, 0.0, f"no response for {timeout_s:g} s")
    finally:
        closed.set()
    total = time.perf_counter() - start
    await read_to_end(call, closed)  # before the channel closes: a call still open then is cancelled
    audio_s = sum(seconds for _, seconds in arrivals)
    if not arrivals:
        return StreamResult(total, total, 0.0, 0, 0.0, "no audio")
    if abs(audio_s - frames / contract.FRAME_RATE) > 1e-6:
        return StreamResult(arrivals[0][0], total, audio_s, 0, 0.0, f"{audio_s:.3f} s of audio, want {frames / contract.FRAME_RATE:.3f}")
    return StreamResult.played(arrivals[0][0], total, audio_s, arrivals)


async def run_workers(url: str, model: str, mode: str, workers: range, requests_per_worker: int, frames: int,
                      timeout_s: float, ready=None) -> tuple[list[StreamResult], float, float]:
    """Run the workers `workers` (their indices seed the requests) -> (results, start, end) with
    start/end in time.time() seconds, comparable across processes. `ready` (a multiprocessing
    Barrier): wait there for the other client processes before the first request."""
    import tritonclient.grpc.aio as grpcclient

    # One channel per 32 streams: a single HTTP/2 connection caps concurrent streams at ~100.
    clients = [grpcclient.InferenceServerClient(url) for _ in range(max(1, -(-len(workers) // 32)))]
    results: list[StreamResult] = []
    if ready is not None:
        ready.wait(120)  # blocks the loop, which has nothing to do yet

    async def worker(index: int) -> None:
        client = clients[index % len(clients)]
        for k in range(requests_per_worker):
            results.append(await one_stream(client, model, frames, index * 100003 + k, mode == "stream", timeout_s))

    start = time.time()
    try:
        await asyncio.gather(*(worker(i) for i in workers))
    finally:
        for client in clients:
            await client.close()
    return results, start, time.time()


def _worker_process(args: tuple, ready, out) -> None:
    results, start, end = asyncio.run(run_workers(*args, ready=ready))
    out.put(([asdict(r) for r in results], start, end))


def run_level(url: str, model: str, mode: str, concurrency: int, requests_per_worker: int, frames: int,
              timeout_s: float, processes: int = 1, start_together: bool = False) -> LevelReport:
    """One level; with processes > 1 the workers are split over that many client processes (one
    Python process decoding ~0.4 MB of audio per stream-second tops out below a GPU's output),
    each beginning once its imports and channels are ready, or, `start_together`, once all are."""
    processes = max(1, min(processes, concurrency))
    shares = [range(concurrency)[i::processes] for i in range(processes)]
    cpu_before, cpu_t0 = _machine_ticks(), time.monotonic()
    if processes == 1:
        results, start, end = asyncio.run(run_workers(url, model, mode, shares[0], requests_per_worker, frames,
                                                      timeout_s))
        spread = 0.0
    else:
        import multiprocessing

        # One process per share, not a Pool: a pool worker may take two shares, and a barrier
        # would then wait for a party that never comes.
        ctx = multiprocessing.get_context("spawn")
        ready, out = (ctx.Barrier(processes) if start_together else None), ctx.Queue()
        procs = [ctx.Process(target=_worker_process, args=((url, model, mode, share, requests_per_worker, frames,
                                                             timeout_s), ready, out)) for share in shares]
        for p in procs:
            p.start()
        parts = [out.get() for _ in procs]  # before join: a child exits once its result is taken
        for p in procs:
            p.join()
        results = [StreamResult(**r) for part, _, _ in parts for r in part]
        start, end = min(p[1] for p in parts), max(p[2] for p in parts)
        spread = max(p[1] for p in parts) - start
    report = level_report(mode, concurrency, results, end - start)
    report.wall_start, report.wall_end = start, end
    report.client_start_spread_s, report.start_together = round(spread, 4), start_together and processes > 1
    cpu_after, seconds = _machine_ticks(), time.monotonic() - cpu_t0
    if cpu_before and cpu_after and seconds > 0:
        report.host_busy_cores, report.host_steal_cores = (
            round((cpu_after[k] - cpu_before[k]) / TICK / seconds, 2) for k in ("busy", "steal"))
    return report


def _machine_ticks() -> Optional[dict]:
    try:
        return machine_ticks()
    except OSError:  # not Linux
        return None


def level_report(mode: str, concurrency: int, results: list[StreamResult], wall: float) -> LevelReport:
    good = [r for r in results if r.error is None]
    report = LevelReport(mode, concurrency, len(results), len(results) - len(good), wall, sum(r.audio_s for r in good))
    report.ttfa_ms = {k: round(v * 1000, 1) for k, v in percentiles([r.ttfa_s for r in good]).items()}
    report.rtf = {k: round(v, 4) for k, v in percentiles([r.rtf for r in good], (50, 95)).items()}
    report.underruns = sum(r.underruns for r in good)
    report.streams_with_underruns = sum(1 for r in good if r.underruns)
    report.stall_s = round(sum(r.stall_s for r in good), 3)
    report.underruns_by_chunk = gaps_by_chunk(good)
    report.errors = sorted({r.error for r in results if r.error})[:5]
    return report


def markdown(reports: list[LevelReport]) -> str:
    lines = ["| mode | conc. | requests | failed | audio-s/s | TTFA p50 / p95 / max ms | RTF p50 / p95 / max | underruns (streams) "
             "| host busy / stolen cores |", "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        t, f = r.ttfa_ms, r.rtf
        lines.append(f"| {r.mode} | {r.concurrency} | {r.requests} | {r.failures} | {r.audio_s_per_s:.1f} | "
                     f"{t.get('p50', '-')} / {t.get('p95', '-')} / {t.get('max', '-')} | "
                     f"{f.get('p50', '-')} / {f.get('p95', '-')} / {f.get('max', '-')} | "
                     f"{r.underruns} ({r.streams_with_underruns}) | {r.host_busy_cores} / {r.host_steal_cores} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="localhost:8001")
    p.add_argument("--model", default="moss_tts")
    p.add_argument("--concurrency", default="1,16,64,128,256", help="comma-separated levels")
    p.add_argument("--mode", default="stream,offline", help="stream, offline or both (comma-separated)")
    p.add_argument("--frames", type=int, default=112, help="frames per utterance (12.5 per second)")
    p.add_argument("--requests", type=int, default=4, help="utterances per worker per level")
    p.add_argument("--warmup", type=int, default=2, help="utterances sent once before the levels")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds without a response = failure")
    p.add_argument("--processes", type=int, default=1, help="client processes per level (spread the decoding)")
    p.add_argument("--start-together", action="store_true",
                   help="client processes wait for each other before their first request (the level's "
                        "wall then holds no client start-up spread)")
    p.add_argument("--out", type=Path, help="write every level's report as JSON")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if not levels or any(c < 1 for c in levels) or not set(modes) <= {"stream", "offline"} or args.frames < 1:
        p.error("--concurrency takes positive integers, --mode stream and/or offline, --frames >= 1")
    if args.warmup:
        run_level(args.url, args.model, "stream", 1, args.warmup, args.frames, args.timeout)
    reports = []
    for mode in modes:
        for concurrency in levels:
            report = run_level(args.url, args.model, mode, concurrency, args.requests, args.frames, args.timeout,
                               args.processes, args.start_together)
            reports.append(report)
            print(markdown([report]).splitlines()[-1], flush=True)
    print(markdown(reports))
    if args.out:
        args.out.write_text(json.dumps([{**asdict(r), "audio_s_per_s": r.audio_s_per_s} for r in reports], indent=2))
    return 1 if any(r.failures for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
