"""Load on the OpenAI shim, level by level, and the same load straight over gRPC: audio-s/s, first
audio p50/p95, the shim's CPU seconds (from /proc) and audio-s/s per shim core, and the first audio
the shim adds (through the shim minus straight to tritonserver, at the same concurrency).

  python -m perf.shim_load --shim-url http://127.0.0.1:8080 --grpc-url 127.0.0.1:8001 \
      --transports grpc,http,grpc_session,ws --concurrency 1,128 --shim-pid 1234 --out shim.json

Transports (perf/shim_clients.py): http (pcm 24 kHz mono), http48 (pcm 48 kHz stereo), sse,
ws (text sessions fed word by word), and their gRPC twins grpc and grpc_session. Each level runs
`concurrency` workers, each sending `--requests` streams one after another (at one stream at
least ONE_STREAM_REQUESTS), spread over
`--processes` client processes. The shim's CPU is the sum over `--shim-pid` and every process
below it (its workers), read before and after each level.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from dataclasses import asdict, replace
from pathlib import Path

from perf.bench_triton import StreamResult, level_report, one_stream
from perf.shim_clients import HTTP_FORMATS, Load, grpc_session, http_stream, ws_session

TRANSPORTS = ("grpc", "http", "http48", "sse", "grpc_session", "ws")
GRPC_TWIN = {"http": "grpc", "http48": "grpc", "sse": "grpc", "ws": "grpc_session"}
STREAMS_PER_CHANNEL = 32  # one HTTP/2 connection caps concurrent streams at ~100 (bench_triton)
ONE_STREAM_REQUESTS = 8  # at least this many at one stream: a p95 of two requests is their maximum


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of `root` and every living process below it."""
    tick = os.sysconf("SC_CLK_TCK")
    stats, children = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


async def one(load: Load, transport: str, seed: int, clients) -> StreamResult:
    start = time.perf_counter()
    try:
        if transport in HTTP_FORMATS:
            work = http_stream(clients["http"], load, transport, seed)
        elif transport == "ws":
            work = ws_session(load, seed)
        elif transport == "grpc":
            work = one_stream(clients["grpc"](seed), load.model, load.frames, seed, True, load.timeout_s)
        else:
            work = grpc_session(clients["grpc"](seed), load, seed)
        return await asyncio.wait_for(work, load.timeout_s)
    except Exception as exc:  # a refused connection, a timeout, a protocol error: that stream failed
        now = time.perf_counter() - start
        return StreamResult(now, now, 0.0, 0, 0.0, f"{type(exc).__name__}: {str(exc)[:200]}")


async def run_workers(load: Load, transport: str, workers: range, requests: int) -> tuple[list[StreamResult], float, float]:
    import httpx
    import tritonclient.grpc.aio as grpcclient

    http = httpx.AsyncClient(timeout=load.timeout_s, limits=httpx.Limits(max_connections=None,
                                                                           max_keepalive_connections=len(workers)))
    channels = [grpcclient.InferenceServerClient(load.grpc_url)
                for _ in range(max(1, -(-len(workers) // STREAMS_PER_CHANNEL)))]
    clients = {"http": http, "grpc": lambda seed: channels[seed % len(channels)]}
    results: list[StreamResult] = []

    async def worker(index: int) -> None:
        for k in range(requests):
            results.append(await one(load, transport, index * 1000 + k, clients))

    try:
        await warm_client(load, transport, http, channels)
        start = time.time()
        await asyncio.gather(*(worker(i) for i in workers))
    finally:
        await http.aclose()
        for channel in channels:
            await channel.close()
    return results, start, time.time()


async def warm_client(load: Load, transport: str, http, channels) -> None:
    """Untimed, before a level: the client process's own first-use costs (httpx's first request
    imports anyio's asyncio backend, ~50 ms, which the first HTTP stream of a fresh client process
    counted as the shim's) and its connections, on both paths alike. A WebSocket session opens its
    own connection, timed, as a voice agent's does."""
    if transport in HTTP_FORMATS:
        (await http.get(f"{load.shim_url}/health")).raise_for_status()
    elif transport in ("grpc", "grpc_session"):
        for channel in channels:
            await channel.is_server_ready()


def _client_process(args: tuple) -> tuple[list[dict], float, float, float]:
    results, start, end = asyncio.run(run_workers(*args))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return [asdict(r) for r in results], start, end, usage.ru_utime + usage.ru_stime


def run_level(load: Load, transport: str, concurrency: int, requests: int, processes: int,
              shim_pids: tuple[int, ...] = ()) -> dict:
    """One level -> its report (bench_triton.LevelReport's fields, `first_audio_ms` for its
    ttfa_ms, plus the CPU seconds of the shim and of the client processes)."""
    import multiprocessing

    processes = max(1, min(processes, concurrency))
    shares = [range(concurrency)[i::processes] for i in range(processes)]
    before = sum(tree_cpu_s(pid) for pid in shim_pids)
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        parts = pool.map(_client_process, [(load, transport, share, requests) for share in shares])
    shim_cpu_s = sum(tree_cpu_s(pid) for pid in shim_pids) - before
    results = [StreamResult(**r) for part in parts for r in part[0]]
    wall = max(p[2] for p in parts) - min(p[1] for p in parts)
    report = asdict(level_report(transport, concurrency, results, wall))
    report["transport"] = report.pop("mode")
    report["first_audio_ms"] = report.pop("ttfa_ms")
    report["audio_s_per_s"] = round(report["audio_s"] / wall, 2) if wall else 0.0
    report["client_cpu_s"] = round(sum(p[3] for p in parts), 2)
    # The level's span (wall clock): perf/trace_phases.py picks the server's traces inside it.
    report["wall_start"], report["wall_end"] = min(p[1] for p in parts), max(p[2] for p in parts)
    if shim_pids and transport in GRPC_TWIN:
        report["shim_cpu_s"] = round(shim_cpu_s, 2)
        report["audio_s_per_shim_cpu_s"] = round(report["audio_s"] / shim_cpu_s, 1) if shim_cpu_s > 0 else None
    return report


def added_first_audio(reports: list[dict]) -> list[dict]:
    """Through the shim minus straight over gRPC, per transport and concurrency (p50, p95 ms)."""
    by_key = {(r["transport"], r["concurrency"]): r for r in reports}
    out = []
    for (transport, concurrency), r in by_key.items():
        twin = by_key.get((GRPC_TWIN.get(transport), concurrency))
        if twin and r["first_audio_ms"] and twin["first_audio_ms"]:
            out.append({"transport": transport, "concurrency": concurrency,
                        **{f"added_{p}_ms": round(r["first_audio_ms"][p] - twin["first_audio_ms"][p], 1)
                           for p in ("p50", "p95")}})
    return out


def markdown(reports: list[dict]) -> str:
    lines = ["| transport | streams | requests | failed | audio-s/s | first audio p50 / p95 ms | shim CPU s | "
             "audio-s/s per shim core | underruns (streams) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        t = r["first_audio_ms"]
        lines.append(f"| {r['transport']} | {r['concurrency']} | {r['requests']} | {r['failures']} | "
                     f"{r['audio_s_per_s']} | {t.get('p50', '-')} / {t.get('p95', '-')} | {r.get('shim_cpu_s', '-')} | "
                     f"{r.get('audio_s_per_shim_cpu_s', '-')} | {r['underruns']} ({r['streams_with_underruns']}) |")
    return "\n".join(lines)


def run_levels(load: Load, transports: list[str], levels: list[int], requests: int, processes: int,
               shim_pids: tuple[int, ...] = (), warmup: int = 1) -> dict:
    """Every transport at every level (a warm-up stream of each transport first)."""
    for transport in transports if warmup else ():
        run_level(load, transport, 1, warmup, 1)
    reports = []
    for transport in transports:
        for concurrency in levels:
            count = max(requests, ONE_STREAM_REQUESTS) if concurrency == 1 else requests
            reports.append(run_level(load, transport, concurrency, count, processes, shim_pids))
            print(markdown(reports[-1:]).splitlines()[-1], flush=True)
    return {"load": asdict(load), "levels": reports, "added_first_audio": added_first_audio(reports)}


def parse_list(text: str, kind=str) -> list:
    return [kind(x.strip()) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Load()
    p.add_argument("--shim-url", default=defaults.shim_url)
    p.add_argument("--grpc-url", default=defaults.grpc_url)
    p.add_argument("--transports", default="grpc,http,grpc_session,ws", help=f"comma-separated: {', '.join(TRANSPORTS)}")
    p.add_argument("--concurrency", default="1,64,128", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=2, help="streams (sessions) per worker per level")
    p.add_argument("--frames", type=int, default=defaults.frames, help="frames per HTTP / gRPC utterance")
    p.add_argument("--segment-frames", type=int, default=defaults.segment_frames, help="frames per session segment")
    p.add_argument("--words-per-s", type=float, default=defaults.words_per_s, help="text-session feed rate")
    p.add_argument("--processes", type=int, default=2, help="client processes per level")
    p.add_argument("--shim-pid", type=int, action="append", default=[], help="the shim's (parent) pid: its CPU")
    p.add_argument("--timeout", type=float, default=defaults.timeout_s, help="seconds per stream")
    p.add_argument("--out", type=Path, help="the levels as JSON")
    args = p.parse_args(argv)
    transports, levels = parse_list(args.transports), parse_list(args.concurrency, int)
    if not set(transports) <= set(TRANSPORTS) or not levels or min(levels) < 1:
        p.error(f"--transports takes {', '.join(TRANSPORTS)}; --concurrency positive integers")
    load = replace(defaults, shim_url=args.shim_url.rstrip("/"), grpc_url=args.grpc_url, frames=args.frames,
                   segment_frames=args.segment_frames, words_per_s=args.words_per_s, timeout_s=args.timeout)
    result = run_levels(load, transports, levels, args.requests, args.processes, tuple(args.shim_pid))
    print(markdown(result["levels"]))
    print(json.dumps(result["added_first_audio"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 1 if any(r["failures"] for r in result["levels"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
