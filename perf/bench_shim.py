"""The OpenAI shim alone, on a CPU: the shim (its real CLI, N worker processes) in front of a fake
`moss_tts` that streams silence at a set pace with the real chunk schedule (perf/fake_tts/), so
that what is measured is the shim's own cost, not the model's.

  .venv/bin/python -m perf.bench_shim --workers 1,2 --concurrency 1,64,128 \
      --transports grpc,http,sse,grpc_session,ws --out perf/results/shim_cpu.json

Per level (perf/shim_load.py): audio-s/s, first audio p50/p95, the shim's CPU seconds and audio
seconds served per shim CPU second (= audio-s/s one fully busy shim core would serve), and the
first audio the shim adds over the same load sent straight to the fake over gRPC. The fake's pace
(perf/fake_tts_server.FakePace: 62.5 frames/s per stream, 5x real time, 20 ms before a request's
first frame) makes 128 streams ask 640 audio-s/s of the shim, about what the real server serves.
On a machine with few cores the load's own client processes share the cores with the shim: the
shim CPU seconds are the shim's alone (from /proc), its audio-s/s are not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

from perf.fake_tts_server import FakePace, start_fake_server
from perf.shim_load import TRANSPORTS, Load, markdown, parse_list, run_levels
from tests.shim_server import start_shim, stop_shim

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict:
    return {"cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "platform": platform.platform(), "cpu": _cpu_model()}


def _cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2", help="shim worker counts, comma-separated (a shim per count)")
    p.add_argument("--transports", default="grpc,http,sse,grpc_session,ws", help=f"comma-separated: {', '.join(TRANSPORTS)}")
    p.add_argument("--concurrency", default="1,64,128")
    p.add_argument("--requests", type=int, default=2, help="streams (sessions) per worker per level")
    p.add_argument("--processes", type=int, default=2, help="client processes per level")
    p.add_argument("--frames-per-s", type=float, default=FakePace.frames_per_s, help="the fake's pace per stream")
    p.add_argument("--words-per-s", type=float, default=Load.words_per_s, help="the text sessions' feed")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    transports = parse_list(args.transports)
    if not set(transports) <= set(TRANSPORTS):
        p.error(f"--transports takes {', '.join(TRANSPORTS)}")
    pace = replace(FakePace(), frames_per_s=args.frames_per_s)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_shim_") as tmp:
        fake = start_fake_server(Path(tmp), pace)
        try:
            grpc_url = f"127.0.0.1:{fake.grpc}"
            for workers in parse_list(args.workers, int):
                # The CLI as scripts/serve.sh starts it, but for the heartbeat check (it reads
                # tritonserver's metrics, and the fake publishes no model heartbeats).
                refs = Path(tmp) / "refs"
                refs.mkdir(exist_ok=True)
                shim = start_shim(grpc_url, Path(tmp) / f"shim_{workers}.log", refs, "--metrics-url", "",
                                  workers=workers)
                try:
                    load = Load(shim_url=shim.url, grpc_url=grpc_url, words_per_s=args.words_per_s)
                    print(f"--- shim with {workers} worker(s)", flush=True)
                    result = run_levels(load, transports, parse_list(args.concurrency, int), args.requests,
                                        args.processes, (shim.process.pid,))
                finally:
                    stop_shim(shim)
                runs.append({"shim_workers": workers, **result})
        finally:
            fake.stop()
    report = {"benchmark": "perf/bench_shim.py", "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(),
              "machine": machine(), "fake_pace": asdict(pace), "words_per_s": args.words_per_s,
              "requests_per_worker": args.requests,
              "client_processes": args.processes, "runs": runs}
    for run in runs:
        print(f"\nshim workers: {run['shim_workers']}\n{markdown(run['levels'])}")
        print("first audio added by the shim (ms):", json.dumps(run["added_first_audio"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return 1 if any(level["failures"] for run in runs for level in run["levels"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
