"""Can client cancels wedge tritonserver 2.51's gRPC stream handler on this machine?

The wedge of docs/structure.md ("A wedge of 2.51's gRPC stream handler", issue 34 round 18): a
client's cancel processed by the one ModelStreamInfer completion-queue thread while a response
callback holds the stream context's `mu_` and waits for the state's `step_mtx_` (or the other
way round) deadlocks both threads; no new stream is ever served again. This drives the
deadlock's ingredients as hard as one machine can: perf/hold_repro's bare decoupled model
sending a response every GAP_MS on many streams at once, every stream cancelled by its client
after a random delay while responses are in flight, tritonserver and its stub pinned to the
cores named by --server-cpus (preemption inside the short windows is what makes the race). It
counts streams started per second; when none starts for --stall-s while streams are offered,
it takes tritonserver's thread backtraces with gdb (when installed) and reports the wedge.
A server that died instead (a crash of the same races) is reported as such, with its log's
stack.

`--lock-jitter EVERY:US` widens the races' windows on purpose: lock_jitter.c, built here and
preloaded into tritonserver alone, sleeps US µs after one mutex acquisition in EVERY.

    .venv/bin/python -m perf.hold_repro.wedge --seconds 300 --streams 96 --server-cpus 0
    .venv/bin/python -m perf.hold_repro.wedge --seconds 120 --lock-jitter 200:200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from perf.hold_repro.repro import Ordering, Server, inputs, make_repository

MODEL = "wedge"


async def one_stream(client, o: Ordering, cancel_after_s: float, first_within_s: float) -> bool:
    """One request on its own stream: once its first response has come, cancelled cancel_after_s
    later (while the model still sends); False when no first response came within first_within_s."""
    closed = asyncio.Event()

    async def requests():
        yield {"model_name": MODEL, "inputs": inputs(o)}
        await closed.wait()

    call = client.stream_infer(requests())
    try:
        try:
            await asyncio.wait_for(call.__anext__(), first_within_s)
        except (TimeoutError, StopAsyncIteration):
            return False
        try:
            async with asyncio.timeout(cancel_after_s):
                while True:
                    result, error = await call.__anext__()
                    if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                        break
        except (TimeoutError, StopAsyncIteration):
            pass
        return True
    finally:
        call.cancel()
        closed.set()


async def drive(url: str, o: Ordering, streams: int, seconds: float, stall_s: float, seed: int) -> dict:
    import tritonclient.grpc.aio as grpcclient

    rng = random.Random(seed)
    client = grpcclient.InferenceServerClient(url)
    started = time.monotonic()
    counts = {"streams": 0, "served": 0, "last_served": started}
    stop = asyncio.Event()

    async def worker() -> None:
        while not stop.is_set():
            counts["streams"] += 1
            # Cancel while the model is still sending: a response every gap_ms for chunks x gap_ms.
            if await one_stream(client, o, rng.uniform(0.0, o.chunks * o.gap_ms / 1000), stall_s):
                counts["served"] += 1
                counts["last_served"] = time.monotonic()

    tasks = [asyncio.create_task(worker()) for _ in range(streams)]
    wedged_at = None
    while time.monotonic() - started < seconds:
        await asyncio.sleep(1.0)
        if time.monotonic() - counts["last_served"] > stall_s:
            wedged_at = counts["last_served"] - started
            break
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    return {"streams": counts["streams"], "served": counts["served"], "seconds": round(time.monotonic() - started, 1),
            "wedged_after_s": None if wedged_at is None else round(wedged_at, 1)}


def backtraces(pid: int, path: Path) -> str:
    """gdb's backtrace of every tritonserver thread into path; what ran."""
    gdb = shutil.which("gdb") or shutil.which("cuda-gdb")
    if gdb is None:
        return "no gdb"
    with open(path, "w") as out:
        subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "set pagination off", "-ex", "thread apply all bt 20"],
                       stdout=out, stderr=subprocess.STDOUT, timeout=300)
    return f"{gdb} -> {path}"


def lock_jitter_env(spec: str, out: Path) -> dict[str, str]:
    """lock_jitter.c built into out; the environment that preloads it into tritonserver only."""
    every, _, us = spec.partition(":")
    if not (every.isdigit() and int(every) > 0 and (not us or us.isdigit())):
        raise SystemExit(f"--lock-jitter wants EVERY:US (positive integers), got {spec!r}")
    library = out / "lock_jitter.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(Path(__file__).with_name("lock_jitter.c"))],
                   check=True)
    return {"LD_PRELOAD": str(library), "LOCK_JITTER": spec, "LOCK_JITTER_ONLY": "tritonserver"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--streams", type=int, default=96, help="streams in flight at once")
    ap.add_argument("--chunks", type=int, default=50, help="responses a stream would send uncancelled")
    ap.add_argument("--gap-ms", type=int, default=1, help="between a stream's responses")
    ap.add_argument("--server-cpus", default="0", help="taskset CPU list for tritonserver and its stub ('' = any)")
    ap.add_argument("--stall-s", type=float, default=15.0, help="no stream served this long = wedged")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lock-jitter", default="", metavar="EVERY:US",
                    help="preload lock_jitter.c into tritonserver: sleep US µs after 1 in EVERY mutex locks")
    ap.add_argument("--out", type=Path, default=None, help="directory for the server log, result and backtraces")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="wedge-"))
    out.mkdir(parents=True, exist_ok=True)
    o = Ordering(args.chunks, args.gap_ms, False, False, "cancel")
    with tempfile.TemporaryDirectory() as tmp:
        extra_env = lock_jitter_env(args.lock_jitter, out) if args.lock_jitter else None
        server = Server(make_repository(Path(tmp), [MODEL]), out / "server.log", extra_env=extra_env)
        if args.server_cpus:  # pinned from its first instruction: its stub inherits the affinity
            subprocess.run(["taskset", "-a", "-p", "-c", args.server_cpus, str(server.process.pid)],
                           check=True, capture_output=True)
        try:
            server.wait_ready([MODEL])
            result = asyncio.run(drive(f"127.0.0.1:{server.grpc}", o, args.streams, args.seconds, args.stall_s,
                                       args.seed))
            if result["wedged_after_s"] is not None:
                result["server_alive"] = server.process.poll() is None
                if result["server_alive"]:
                    result["backtraces"] = backtraces(server.process.pid, out / "backtraces.txt")
                else:
                    result["server_exit_code"] = server.process.returncode
        finally:
            result_exit = server.stop()
    result.update(server_exit_s=result_exit, out=str(out), chunks=args.chunks, gap_ms=args.gap_ms,
                  server_cpus=args.server_cpus, lock_jitter=args.lock_jitter or None)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
