"""Does a client-side stream cancel make tritonserver 2.51 keep a decoupled model loaded at SIGTERM?

Each run starts the real tritonserver (scripts/triton_env.sh) on a throw-away repository holding
one copy of model/ per ordering (`hold_<ordering>`), drives that copy only with that ordering's
streams (every ordering at once, one request per gRPC stream, as client/tts_client.py does),
then sends SIGTERM and reads the log: a copy that never logs "successfully unloaded" was held by
a leaked gRPC stream state (README.md says which, with the r24.10 source lines).

    .venv/bin/python -m perf.hold_repro.repro --runs 5 --streams 300
    .venv/bin/python -m perf.hold_repro.repro --orderings timed_cancel,drain --runs 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.triton_server import free_port, spawn, stop_server, wait_ready

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass(frozen=True)
class Ordering:
    """What the model sends (chunks gap_ms apart, then FINAL) and when the client cancels."""
    chunks: int
    gap_ms: int
    final_with_data: bool
    empty_final: bool  # the request asks for an empty final response (moss_tts clients do)
    end: str  # how the client ends the stream (one_stream)
    rejected: bool = False  # CHUNKS sent as FP32: Triton refuses the request before the model
    stop_on_cancel: bool = False  # the model ends at once when it sees the cancel (as moss_tts does)


ORDERINGS = {
    # The soak's stream (before the fix): read to the final, half-close, drop the call. grpc.aio
    # keeps a call alive until its status comes (an instrumented run: 0 cancels in 400), so this
    # ends without a cancel.
    "final_gc": Ordering(2, 1, False, True, "gc"),
    # perf/soak.py's end: the stream returns at the final and its channel is closed at once
    # (InferenceServerClient.close() cancels every call whose OK status has not come yet).
    "final_close": Ordering(2, 1, False, True, "close"),
    # The same, cancelled explicitly right after the final response.
    "final_cancel": Ordering(2, 1, False, True, "cancel"),
    # Cancel on the last data chunk: the model's FINAL follows it at once.
    "last_chunk_cancel": Ordering(3, 2, False, True, "cancel_before_final"),
    # FINAL alone after gap_ms; the client cancels at the median time to the final +- 3 ms (no
    # response is written for the final: the state goes to WRITEREADY).
    "timed_cancel": Ordering(0, 20, False, False, "timed"),
    # As timed_cancel, but an empty final response is asked for (the state goes to WRITTEN).
    "timed_cancel_empty": Ordering(0, 20, False, True, "timed"),
    # The first request is refused by Triton (wrong dtype): its error response ends it; then the
    # stream is cancelled / dropped / its channel closed.
    "rejected_cancel": Ordering(1, 1, False, True, "cancel", rejected=True),
    "rejected_gc": Ordering(1, 1, False, True, "gc", rejected=True),
    "rejected_close": Ordering(1, 1, False, True, "close", rejected=True),
    # Controls: cancel long before the end; read to the final, half-close, read on to the OK.
    "mid_cancel": Ordering(5, 20, False, True, "cancel_after_first"),
    "drain": Ordering(2, 1, False, True, "drain"),
    # moss_tts's way: the model checks the cancel before each chunk and sends its final at once;
    # chunks 1 ms apart, so a chunk's write is often still pending when the cancel lands. This one
    # crashes tritonserver 2.51 in about half the runs (README.md, "What remains").
    "mid_cancel_stop": Ordering(40, 1, False, True, "cancel_after_first", stop_on_cancel=True),
}
JITTER_MS = 3.0


def infer_once(http_url: str, model: str) -> None:
    """One request over HTTP to a model with one INT32 [1] input "IN" (the repro models of perf/)."""
    body = json.dumps({"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}).encode()
    request = urllib.request.Request(f"http://{http_url}/v2/models/{model}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200, response.status


def triton_env() -> dict[str, str]:
    out = subprocess.run(["bash", "-c", f"source {ROOT}/scripts/triton_env.sh && env -0"],
                         capture_output=True, check=True).stdout.decode()
    return dict(line.split("=", 1) for line in out.split("\0") if "=" in line)


def make_repository(tmp: Path, names: list[str], model: Path = HERE / "model",
                    params: dict[str, str] | None = None) -> Path:
    """tmp/models holding `model` (a model directory of perf/) once per name, each config with
    `params` added as pbtxt parameters."""
    repo = tmp / "models"
    extra = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in (params or {}).items())
    for name in names:
        shutil.copytree(model, repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(f'name: "{name}"\n' + config.read_text() + extra)
    return repo


class Server:
    """tritonserver itself on `repo` (tests/triton_server.py's harness, without scripts/serve.sh)."""

    def __init__(self, repo: Path, log_path: Path, verbose: int = 0, exit_timeout_s: int = 6,
                 extra_env: dict[str, str] | None = None) -> None:
        env = {**triton_env(), **(extra_env or {})}
        self.grpc, http, metrics = free_port(), free_port(), free_port()
        self.log_path = log_path
        self.server = spawn(
            [env["TRITONSERVER"], f"--model-repository={repo}", f"--backend-directory={env['TRITON_BACKENDS']}",
             f"--http-port={http}", f"--grpc-port={self.grpc}", f"--metrics-port={metrics}",
             f"--log-verbose={verbose}", f"--exit-timeout-secs={exit_timeout_s}"], env, log_path, http, self.grpc, metrics)
        self.http_url, self.process = self.server.http_url, self.server.process

    def wait_ready(self, names: list[str], timeout: float = 120.0) -> None:
        wait_ready(self.server, names, timeout)

    def stop(self, timeout: float = 60.0) -> float:
        """SIGTERM -> exit seconds; what is left of its process group is killed (a crashed server's stubs)."""
        return stop_server(self.server, timeout, check_crashes=False, kill_leftovers=True)


def inputs(o: Ordering):
    import tritonclient.grpc.aio as grpcclient

    tensors = []
    chunks = ("CHUNKS", "FP32", np.float32(o.chunks)) if o.rejected else ("CHUNKS", "INT32", np.int32(o.chunks))
    for name, dtype, value in (chunks, ("GAP_MS", "INT32", np.int32(o.gap_ms)),
                               ("FINAL_WITH_DATA", "BOOL", np.bool_(o.final_with_data)),
                               ("STOP_ON_CANCEL", "BOOL", np.bool_(o.stop_on_cancel))):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value]))
        tensors.append(t)
    return tensors


async def time_to_final(client, model: str, o: Ordering, count: int = 15) -> float:
    """Median seconds from sending to the final response, streams drained (no cancel)."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        # an empty final response is asked for, else a flag-only final would never reach us
        await one_stream(client, model, Ordering(o.chunks, o.gap_ms, o.final_with_data, True, "drain", o.rejected,
                                                 o.stop_on_cancel),
                         random.Random(0), on_final=lambda: times.append(time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


async def one_stream(client, model: str, o: Ordering, rng: random.Random, cancel_at_s: float = 0.0,
                     on_final=None) -> str:
    """One request on its own stream, ended the ordering's way; -> what the client saw. Ends:
    "gc" / "close": return at the final (the worker closes a "close" stream's own channel then);
    "cancel": cancel right after the final; "cancel_before_final": on the last data chunk;
    "cancel_after_first": on the first; "timed": at cancel_at_s +- JITTER_MS after sending;
    "drain": half-close and read to the server's status."""
    closed = asyncio.Event()
    request = {"model_name": model, "inputs": inputs(o),
               "parameters": {"triton_enable_empty_final_response": True} if o.empty_final else None}

    async def requests():
        yield request
        await closed.wait()  # half-closing early would end the stream before its responses

    call = client.stream_infer(requests())
    loop = asyncio.get_running_loop()
    timer, fired = None, asyncio.Event()
    if o.end == "timed":  # the cancel lands at its time whether the final came first or not
        delay = max(0.0, cancel_at_s + rng.uniform(-JITTER_MS, JITTER_MS) / 1000)
        timer = loop.call_later(delay, lambda: (call.cancel(), fired.set()))
    seen = 0
    try:
        while True:
            result, error = await call.__anext__()
            if error is not None:  # an error response is the request's last
                if not o.rejected:
                    return f"error {error}"
                seen, is_final = 0, True
            else:
                seen += 1
                is_final = result.get_response().parameters["triton_final_response"].bool_param
            if o.end == "cancel_after_first" or (o.end == "cancel_before_final" and seen == o.chunks):
                call.cancel()
                return "cancelled"
            if is_final:
                if on_final is not None:
                    on_final()
                break
        if o.end == "cancel":
            call.cancel()
        elif o.end == "timed":
            await fired.wait()
        elif o.end == "drain":
            closed.set()
            async for _ in call:  # the server's half-close -> Finish(OK) ends this
                pass
        return "rejected" if o.rejected else "final"
    except (StopAsyncIteration, asyncio.CancelledError):
        return "cancelled"
    except Exception as exc:  # the grpc error after our own cancel
        return "cancelled" if "CANCELLED" in str(exc).upper() else f"error {type(exc).__name__}"
    finally:
        if timer is not None:
            timer.cancel()
        closed.set()


async def drive(url: str, names: dict[str, Ordering], streams: int, concurrency: int, seed: int) -> dict:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    rng = random.Random(seed)
    outcomes: dict[str, dict[str, int]] = {n: {} for n in names}

    cancel_at = {n: await time_to_final(client, n, o) for n, o in names.items() if o.end == "timed"}
    print(f"timed cancels centred on the median time to the final: {cancel_at}", flush=True)

    async def worker(name: str, o: Ordering, count: int) -> None:
        for _ in range(count):
            own = grpcclient.InferenceServerClient(url) if o.end == "close" else None
            try:
                seen = await asyncio.wait_for(one_stream(own or client, name, o, rng, cancel_at.get(name, 0.0)), 30)
            except asyncio.TimeoutError:
                seen = "no end in 30 s"
            if own is not None:
                await own.close()
            outcomes[name][seen] = outcomes[name].get(seen, 0) + 1

    per_worker = max(1, streams // concurrency)
    await asyncio.gather(*(worker(n, o, per_worker) for n, o in names.items() for _ in range(concurrency)))
    await client.close()
    return outcomes


# --log-verbose 1 only: the cancel notification met a state whose final had already arrived
# (WRITEREADY: flag-only final, alarm pending; WRITTEN: final response being written) and
# IssueRequestCancellation marked it CANCELLATION_ISSUED: no callback will ever release it.
LEAK = re.compile(r'infer_handler.h:850\] "Cancellation notification received for ModelStreamInferHandler.*'
                  r'step (WRITEREADY|WRITTEN)"\n(?:.*\n){0,2}?.*Issuing cancellation for')


def unload_report(log: str, names: list[str]) -> dict:
    unloaded = [n for n in names if f"successfully unloaded '{n}'" in log]
    live = [int(m) for m in re.findall(r"Found (\d+) live models", log)]
    report = {"held": [n for n in names if n not in unloaded], "live_at_exit": live[-1] if live else None,
              "exit_timeout": "Exit timeout expired" in log, "crashed": "Signal (11) received" in log}
    if "infer_handler.h:" in log:  # verbose: count the leaked states (all orderings together)
        report["leaked_states"] = dict(collections.Counter(m.group(1) for m in LEAK.finditer(log)))
    return report


def one_run(args, run: int, out_dir: Path) -> dict:
    names = {f"hold_{k}": ORDERINGS[k] for k in args.orderings}
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repository(Path(tmp), list(names))
        log_path = out_dir / f"run{run}.log"
        server = Server(repo, log_path, args.log_verbose)
        try:
            server.wait_ready(list(names))
            start = time.monotonic()
            outcomes = asyncio.run(drive(f"127.0.0.1:{server.grpc}", names, args.streams, args.concurrency,
                                         args.seed + run))
            load_s = time.monotonic() - start
            time.sleep(args.settle_s)
        finally:
            exit_s = server.stop()
    report = {"run": run, "load_s": round(load_s, 1), "exit_s": round(exit_s, 1), "outcomes": outcomes,
              **unload_report(log_path.read_text(errors="replace"), list(names))}
    print(json.dumps(report), flush=True)
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--orderings", type=lambda s: s.split(","), default=list(ORDERINGS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--streams", type=int, default=200, help="streams per ordering per run")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent streams per ordering")
    p.add_argument("--settle-s", type=float, default=1.0, help="idle time between the load and SIGTERM")
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "hold_repro")
    args = p.parse_args()
    unknown = set(args.orderings) - set(ORDERINGS)
    if unknown:
        p.error(f"unknown orderings {sorted(unknown)}; known: {sorted(ORDERINGS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: exit(1))  # a `timeout` still stops our tritonserver
    reports = [one_run(args, run, args.out) for run in range(args.runs)]
    held = {k: sum(f"hold_{k}" in r["held"] for r in reports if not r["crashed"]) for k in args.orderings}
    print(json.dumps({"runs": args.runs, "streams_per_ordering": args.streams, "runs_holding_model": held,
                      "runs_crashed": sum(r["crashed"] for r in reports)}))


if __name__ == "__main__":
    main()
