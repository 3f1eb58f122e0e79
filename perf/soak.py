"""Soak: many concurrent streams against a running server, random cancels and bad input mixed in,
then proof that nothing is left behind.

  python perf/soak.py --url localhost:8001 --metrics-url http://localhost:8002/metrics \
      --concurrency 256 --seconds 600 --cancel-fraction 0.2 --min-frames 40 --max-frames 112 --out soak.json

Every worker runs one request after another until the time is up. A request is, by chance:
a cancel (the gRPC stream is cancelled before its first response or after 1-3 chunks), a bad
input (must end in one INVALID_ARGUMENT error, or Triton's own rejection for a wrong dtype),
or a normal request: streamed audio, STREAM=false, CODES only, a clone, a continuation, or the
moss_tts_codes ensemble. Normal requests use IGNORE_STOP, so their length is known and checked.
After the load: within `--settle` seconds no stream, engine row or vocoder session may be in
use, and every model instance's heartbeat must move (client/server_health.py). Exit 0 when
all of it holds; the JSON report says what happened (tests/test_soak.py runs a short one).

While it runs, every client process writes one progress line to stderr every 10 s (requests ended,
failures, requests in flight and the oldest one's age, its RSS) and one line when it is done. A
client process that dies is named in the report with its exit code or signal, the others are told
to stop, and the end checks still run (tests/test_soak_clients.py).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import os
import random
import signal
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Callable, Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.server_health import check as heartbeats_move, fetch  # noqa: E402
from moss_tts import contract  # noqa: E402

SPF = contract.SAMPLES_PER_FRAME
BAD_INPUTS = [({"TEXT": ""}, "TEXT is empty"), ({"TOP_P": 5.0}, "top_p must be in"),
              ({"MAX_FRAMES": 0}, "max_frames must be in"), ({"MODE": "sing"}, "MODE must be one of"),
              ({"MODE": "continuation"}, "continuation needs"),
              ({"REFERENCE_AUDIO": b"RIFF not audio"}, "could not be decoded"),
              ({"TOP_K": ("FP32", 3.0)}, None)]  # a wrong dtype: Triton itself rejects it
PROGRESS_S = 10.0  # seconds between a client process's progress lines
STOP_POLL_S = 0.5  # seconds between a client process's looks at the stop flag
STOP_GRACE_S = 15.0  # after the response timeout: read_to_end's 10 s to a stream's status, and slack
STARTUP_S = 60.0  # a spawned client process's imports and channel, on a loaded host
EXIT_S = 10.0  # seconds a client process that sent its report has to exit


@dataclass(frozen=True)
class SoakConfig:
    url: str
    concurrency: int
    seconds: float
    cancel_fraction: float = 0.2
    bad_fraction: float = 0.1
    min_frames: int = 6
    max_frames: int = 30
    response_timeout_s: float = 120.0
    seed: int = 0


@dataclass
class SoakReport:
    outcomes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    first_audio_s: list[float] = field(default_factory=list)
    audio_seconds: float = 0.0
    wall_seconds: float = 0.0
    end_state: dict = field(default_factory=dict)
    end_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.end_problems

    def summary(self) -> dict:
        ttfa = sorted(self.first_audio_s)
        pct = (lambda q: round(ttfa[min(len(ttfa) - 1, int(q * len(ttfa)))] * 1000, 1) if ttfa else None)
        return {"ok": self.ok, "requests": sum(self.outcomes.values()), "outcomes": dict(self.outcomes),
                "failures": self.failures[:20], "num_failures": len(self.failures),
                "first_audio_ms_p50": pct(0.5), "first_audio_ms_p95": pct(0.95),
                "audio_seconds": round(self.audio_seconds, 1), "wall_seconds": round(self.wall_seconds, 1),
                "end_state": self.end_state, "end_problems": self.end_problems}


def tone_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def make_inputs(values: dict, ensemble: bool = False):
    import tritonclient.grpc.aio as grpcclient

    inputs = []
    for name, value in values.items():
        shape = [1, 1] if ensemble and name == "REFERENCE_AUDIO" else [1]
        if isinstance(value, tuple):  # (forced dtype, value): a deliberately wrong type
            dtype, value = value
            array = np.array([value], dtype=contract.NUMPY_DTYPES[dtype])
        else:
            dtype, array = contract.INPUTS[name].dtype, contract.input_array(name, value, shape)
        tensor = grpcclient.InferInput(name, shape, dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def say(text: str) -> None:
    """One line to stderr at once: the soak's log is what is left when a run goes wrong."""
    print(text, file=sys.stderr, flush=True)


def rss_mib() -> float:
    """This process's resident memory in MiB (/proc/self/statm counts pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Soak:
    def __init__(self, config: SoakConfig, client, reference: bytes, label: str = "soak client 0") -> None:
        self.config = config
        self.client = client
        self.reference = reference
        self.label = label  # names this client process in its stderr lines
        self.report = SoakReport()
        self.deadline = float("inf")  # monotonic; moved to now when the client processes are told to stop
        self.busy_since: dict[int, float] = {}  # worker index -> monotonic start of its request in flight

    async def request(self, model: str, values: dict, outputs: Optional[list[str]] = None, cancel_after=None,
                      ensemble: bool = False):
        """-> (responses, error message or None, first response seconds). cancel_after: ("delay", s)
        or ("chunks", n): cancel the gRPC stream then."""
        import tritonclient.grpc.aio as grpcclient

        from client.openai_shim.triton_stream import read_to_end

        closed = asyncio.Event()
        request = {"model_name": model, "inputs": make_inputs(values, ensemble),
                   "parameters": {"triton_enable_empty_final_response": True}}
        if outputs:
            request["outputs"] = [grpcclient.InferRequestedOutput(name) for name in outputs]

        async def requests():
            yield request
            await closed.wait()  # half-closing early would end the stream before its responses

        call = self.client.stream_infer(requests())
        start, first, responses = time.perf_counter(), None, []
        canceller = None
        if cancel_after and cancel_after[0] == "delay":
            canceller = asyncio.get_running_loop().call_later(cancel_after[1], call.cancel)

        async def ended(error: Optional[str]):
            # The request is over: no cancel from here on, the stream is read to its status (a
            # cancel now, or closing the channel before the status came, can leave tritonserver
            # holding moss_tts at shutdown: perf/hold_repro/README.md).
            if canceller is not None:
                canceller.cancel()
            await read_to_end(call, closed)
            return responses, error, first

        try:
            while True:
                result, error = await asyncio.wait_for(call.__anext__(), self.config.response_timeout_s)
                first = first if first is not None else time.perf_counter() - start
                if error is not None:
                    return await ended(error.message())
                responses.append(result)
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return await ended(None)
                if cancel_after and cancel_after[0] == "chunks" and len(responses) >= cancel_after[1]:
                    call.cancel()
                    return responses, "cancelled by us", first
        except (StopAsyncIteration, asyncio.CancelledError):
            return responses, "cancelled by us", first
        except asyncio.TimeoutError:
            call.cancel()
            return responses, f"no response for {self.config.response_timeout_s:.0f} s", first
        except Exception as exc:  # grpc errors after our own cancel, mostly
            return responses, f"{type(exc).__name__}: {exc}", first
        finally:
            if canceller is not None:
                canceller.cancel()
            closed.set()

    async def one(self, rng: random.Random) -> None:
        roll = rng.random()
        if roll < self.config.cancel_fraction:
            await self.cancelled(rng)
        elif roll < self.config.cancel_fraction + self.config.bad_fraction:
            await self.bad(rng)
        else:
            await self.normal(rng)

    async def cancelled(self, rng: random.Random) -> None:
        frames = self.config.max_frames * 4  # long enough to still be running when cancelled
        how = ("delay", rng.uniform(0.0, 0.5)) if rng.random() < 0.3 else ("chunks", rng.randint(1, 3))
        values = {"TEXT": "This will be cut short.", "SEED": rng.randrange(1 << 30), "MAX_FRAMES": frames,
                  "IGNORE_STOP": True, "FIRST_CHUNK_FRAMES": 2, "CHUNK_FRAMES": 4}
        _, error, _ = await self.request("moss_tts", values, cancel_after=how)
        if error is None:  # finished before the cancel landed: fine, but say so
            self.report.outcomes["cancel came too late"] += 1
        elif error == "cancelled by us" or "CANCELLED" in error:
            self.report.outcomes["cancelled"] += 1
        else:
            self.fail("cancel", error)

    async def bad(self, rng: random.Random) -> None:
        bad, expected = rng.choice(BAD_INPUTS)
        values = {"TEXT": "Hello.", "MAX_FRAMES": 4, "IGNORE_STOP": True, **bad}
        _, error, _ = await self.request("moss_tts", values)
        if error is None:
            self.fail("bad input", f"{bad} was accepted")
        elif expected is None or (error.startswith("[INVALID_ARGUMENT]") and expected in error):
            self.report.outcomes["bad input rejected"] += 1
        else:
            self.fail("bad input", f"{bad}: {error}")

    async def normal(self, rng: random.Random) -> None:
        frames = rng.randint(self.config.min_frames, self.config.max_frames)
        kind = rng.choice(["stream", "stream", "stream", "offline", "codes", "clone", "continuation", "ensemble"])
        values = {"TEXT": f"Soak request {rng.randrange(10**6)}.", "SEED": rng.randrange(1 << 30),
                  "MAX_FRAMES": frames, "IGNORE_STOP": True}
        model, outputs, output, ensemble = "moss_tts", ["AUDIO"], "AUDIO", False
        if kind == "offline":
            values["STREAM"] = False
        elif kind == "codes":
            outputs, output = ["CODES"], "CODES"
        elif kind in ("clone", "continuation"):
            values["REFERENCE_AUDIO"] = self.reference
            if kind == "continuation":
                values.update(MODE="continuation", REFERENCE_TEXT="A reference. ")
        elif kind == "ensemble":
            model, outputs, output, ensemble = "moss_tts_codes", ["CODES"], "CODES", True
            values["REFERENCE_AUDIO"] = b""
        responses, error, first = await self.request(model, values, outputs, ensemble=ensemble)
        if error is not None:
            if "busy" in error:
                self.report.outcomes["busy"] += 1
                await asyncio.sleep(0.2)  # back off as a real client would, instead of spinning
            else:
                self.fail(kind, error)
            return
        arrays = [r.as_numpy(output) for r in responses if r.as_numpy(output) is not None]
        got = sum(a.shape[1] // SPF if output == "AUDIO" else a.shape[0] for a in arrays)
        if got != frames:
            self.fail(kind, f"{got} frames came back, {frames} were asked for")
            return
        self.report.outcomes[f"{kind} ok"] += 1
        self.report.audio_seconds += frames / 12.5
        if output == "AUDIO" and kind != "offline" and first is not None:
            self.report.first_audio_s.append(first)

    def fail(self, kind: str, detail: str) -> None:
        self.report.failures.append(f"{kind}: {detail}")

    async def worker(self, index: int) -> None:
        rng = random.Random(self.config.seed * 100003 + index)
        while time.monotonic() < self.deadline:
            self.busy_since[index] = time.monotonic()
            try:
                await self.one(rng)
            except Exception as exc:
                # request() turns every gRPC outcome into an error string, so this is the soak's own
                # bug: shown and counted, and this worker stops rather than repeat it in a tight loop.
                say(f"{self.label}: {type(exc).__name__} escaped worker {index}, which stops:\n{traceback.format_exc()}")
                self.fail("worker", f"{index}: {type(exc).__name__}: {exc}")
                return
            finally:
                del self.busy_since[index]

    def progress(self, elapsed_s: float) -> str:
        now = time.monotonic()
        oldest = f" (oldest {now - min(self.busy_since.values()):.0f} s)" if self.busy_since else ""
        ended = sum(self.report.outcomes.values()) + len(self.report.failures)
        return (f"{self.label}: {elapsed_s:.0f} s, {ended} requests ended, {len(self.report.failures)} failed, "
                f"{len(self.busy_since)} in flight{oldest}, rss {rss_mib():.0f} MiB")

    async def watch(self, start: float, stop=None) -> None:
        """Progress every PROGRESS_S; `stop` (a multiprocessing.Event, set when another client
        process died) ends the load: no new requests, those in flight run to their end."""
        next_line = start + PROGRESS_S
        while True:
            await asyncio.sleep(STOP_POLL_S)
            now = time.monotonic()
            if stop is not None and stop.is_set() and self.deadline > now:
                self.deadline = now
                say(f"{self.label}: told to stop; {len(self.busy_since)} requests in flight run to their end")
            if now >= next_line:
                say(self.progress(now - start))
                next_line += PROGRESS_S


async def run_load(config: SoakConfig, label: str = "soak client 0", stop=None) -> SoakReport:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(config.url)
    soak = Soak(config, client, tone_wav(), label)
    start = time.monotonic()
    soak.deadline = start + config.seconds
    watcher = asyncio.create_task(soak.watch(start, stop))
    try:
        await asyncio.gather(*(soak.worker(i) for i in range(config.concurrency)))
    finally:
        watcher.cancel()
        await client.close()
    soak.report.wall_seconds = time.monotonic() - start
    return soak.report


def read_metrics(metrics_url: str) -> dict[str, float]:
    """Our custom series summed over model instances, e.g. {'moss_engine{stat="running"}': 0.0}."""
    return sum_instances(fetch(metrics_url, 10.0))


def sum_instances(text: str) -> dict[str, float]:
    """Prometheus text -> {series without its `model_instance` label: sum over instances} for moss_*
    series (a multi-GPU layout runs one engine and one vocoder per GPU)."""
    import re

    totals: dict[str, float] = {}
    for m in re.finditer(r"^(moss_\S+) (\S+)$", text, re.M):
        key = re.sub(r'(?<=[{,])model_instance="[^"]*",?', "", m.group(1)).replace(",}", "}").replace("{}", "")
        totals[key] = totals.get(key, 0.0) + float(m.group(2))
    return totals


IN_PROCESS_SESSIONS = 'moss_tts_vocoder{stat="active_slots"}'  # moss_tts's own vocoder (vocoder=in_process)
IN_FLIGHT = 'moss_tts_requests{stat="in_flight"}'  # moss_tts's requests without their final flag yet
DOUBLE_FINALS = 'moss_tts_requests{stat="double_finals"}'


def vocoder_sessions(m: dict[str, float]) -> float:
    """Open codec sequences: the vocoder model's (direct callers, BLS) + moss_tts's in-process ones."""
    return m.get('moss_vocoder_sessions{state="active"}', 0.0) + m.get(IN_PROCESS_SESSIONS, 0.0)


def idle_problems(m: dict[str, float], max_running: int) -> list[str]:
    """What is still in use once every client is gone (empty list = nothing)."""
    wanted = {'moss_engine{stat="streams"}': 0, 'moss_engine{stat="running"}': 0,
              'moss_engine{stat="waiting"}': 0, 'moss_engine{stat="free_slots"}': max_running,
              'moss_vocoder_sessions{state="active"}': 0}
    for name in (IN_PROCESS_SESSIONS, IN_FLIGHT, DOUBLE_FINALS):
        if name in m:  # series of the current moss_tts (older servers lack them)
            wanted[name] = 0
    return [f"{name} is {m.get(name)}, want {value}" for name, value in wanted.items() if m.get(name) != value]


def settle(metrics_url: str, max_running: int, timeout_s: float) -> tuple[dict, list[str]]:
    """Wait until nothing is in use, then check the heartbeats; -> (metrics, problems)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = read_metrics(metrics_url)
        problems = idle_problems(metrics, max_running)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    beat = heartbeats_move(metrics_url)
    return metrics, problems + ([beat] if beat else [])


Load = Callable[[SoakConfig, int, object], SoakReport]  # (config, client process index, stop Event or None)


def load_in_process(config: SoakConfig, index: int, stop=None) -> SoakReport:
    """One client process's load: the default Load."""
    return asyncio.run(run_load(config, f"soak client {index}", stop))


def checked_load(load: Load, config: SoakConfig, index: int, stop=None) -> SoakReport:
    """`load`'s report; an exception that escapes it is printed with its traceback and becomes the
    report's failure, so it is not lost with the process."""
    label = f"soak client {index}"
    try:
        report = load(config, index, stop)
    except Exception as exc:
        say(f"{label}: the load raised {type(exc).__name__}:\n{traceback.format_exc()}")
        return SoakReport(failures=[f"{label}: the load raised {type(exc).__name__}: {exc}"])
    ended = sum(report.outcomes.values()) + len(report.failures)
    say(f"{label}: finished normally after {report.wall_seconds:.0f} s: {ended} requests ended, "
        f"{len(report.failures)} failed")
    return report


def _client_process(load: Load, config: SoakConfig, index: int, stop, writer: Connection) -> None:
    writer.send(checked_load(load, config, index, stop))
    writer.close()


def exit_reason(code: Optional[int]) -> str:
    """A multiprocessing exitcode in words (negative: the signal that killed the process)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class ClientProcess:
    """One spawned client process and the pipe its report comes back on."""

    index: int
    process: multiprocessing.process.BaseProcess
    reader: Connection
    report: Optional[SoakReport] = None
    ended: bool = False

    @classmethod
    def start(cls, ctx, load: Load, config: SoakConfig, index: int, stop) -> "ClientProcess":
        reader, writer = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_client_process, args=(load, config, index, stop, writer),
                              name=f"soak client {index}", daemon=True)
        process.start()
        writer.close()  # the child holds the only write end left, so its death reads as EOF here
        return cls(index, process, reader)

    @property
    def name(self) -> str:
        return f"client process {self.index} (pid {self.process.pid})"

    def handles(self) -> list:
        """What to wait on: the pipe until the report came (a report larger than the pipe's buffer
        is only written while it is read), the process until it exits."""
        return ([] if self.reader.closed else [self.reader]) + [self.process.sentinel]

    def receive(self) -> None:
        """Take the report if it has come; never waits on an empty pipe."""
        if self.reader.closed:
            return
        try:
            if self.reader.poll():
                self.report = self.reader.recv()
                self.reader.close()
        except (EOFError, OSError):  # the write end closed before a whole report: the process died
            self.reader.close()

    def end(self) -> Optional[str]:
        """The process has exited: None if it exited 0 after its report, else what went wrong."""
        self.receive()  # a report written just before the exit
        self.ended = True
        code = self.process.exitcode
        if self.report is None:
            return f"{self.name} died without a report: {exit_reason(code)}"
        return None if code == 0 else f"{self.name} sent its report, then ended with {exit_reason(code)}"

    def kill(self, why: str) -> str:
        self.process.terminate()
        self.process.join(5.0)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(5.0)
        self.ended = True
        return f"{self.name} {why}: terminated ({exit_reason(self.process.exitcode)})"


def split(config: SoakConfig, processes: int) -> list[SoakConfig]:
    """One config per client process: the concurrency shared out, a seed of its own."""
    shares = [config.concurrency // processes + (i < config.concurrency % processes) for i in range(processes)]
    return [replace(config, concurrency=n, seed=config.seed * 1000 + i) for i, n in enumerate(shares) if n]


def run_clients(config: SoakConfig, processes: int, load: Load = load_in_process,
                grace_s: Optional[float] = None) -> SoakReport:
    """The load in `processes` spawned client processes, so one Python process is not what limits
    hundreds of streams. A process that dies is named among the report's failures with its exit
    code or signal; the others are then told to stop and get `grace_s` (default: the response
    timeout and STOP_GRACE_S) to end the requests they have in flight, then are terminated. Every
    wait has a deadline: a dead or stuck client process never hangs the soak."""
    grace_s = config.response_timeout_s + STOP_GRACE_S if grace_s is None else grace_s
    ctx = multiprocessing.get_context("spawn")  # a clean interpreter: nothing of the parent's state
    stop = ctx.Event()
    clients = [ClientProcess.start(ctx, load, part, i, stop) for i, part in enumerate(split(config, processes))]
    # perf/h200_scaling.sh reads the pids from this line (spawned, they do not show soak.py in ps).
    say(f"soak: {len(clients)} client processes (pids {' '.join(str(c.process.pid) for c in clients)}), "
        f"{config.concurrency} streams for {config.seconds:g} s")
    failures: list[str] = []
    deadline = time.monotonic() + STARTUP_S + config.seconds + grace_s
    while (live := [c for c in clients if not c.ended]) and time.monotonic() < deadline:
        wait([h for c in live for h in c.handles()], max(0.0, deadline - time.monotonic()))
        for c in live:
            c.receive()
            problem = c.end() if c.process.exitcode is not None else None
            if problem is None:
                continue
            failures.append(problem)
            say(f"soak: {problem}")
            if not stop.is_set():
                stop.set()
                deadline = min(deadline, time.monotonic() + grace_s)
                say(f"soak: the other client processes are told to stop; they have {grace_s:.0f} s")
        if all(c.report is not None for c in clients):
            deadline = min(deadline, time.monotonic() + EXIT_S)
    for c in clients:
        if not c.ended:
            why = ("sent its report but had not exited" if c.report is not None
                   else "had not ended after the stop" if stop.is_set() else "had not ended by the deadline")
            failures.append(c.kill(why))
            say(f"soak: {failures[-1]}")
    report = merge([c.report for c in clients if c.report is not None])
    report.failures[:0] = failures  # first: the summary keeps only the first 20 failures
    return report


def merge(reports: list[SoakReport]) -> SoakReport:
    merged = SoakReport()
    for r in reports:
        merged.outcomes.update(r.outcomes)
        merged.failures += r.failures
        merged.first_audio_s += r.first_audio_s
        merged.audio_seconds += r.audio_seconds
        merged.wall_seconds = max(merged.wall_seconds, r.wall_seconds)
    return merged


def soak(config: SoakConfig, metrics_url: str, max_running: int, settle_s: float = 30.0,
         processes: int = 1, load: Load = load_in_process) -> SoakReport:
    """The load (here, or in `processes` client processes: run_clients), then the end checks,
    whatever became of the load."""
    report = checked_load(load, config, 0) if processes <= 1 else run_clients(config, processes, load)
    try:
        metrics, report.end_problems = settle(metrics_url, max_running, settle_s)
    except OSError as exc:  # a server that no longer answers: that is the end checks' finding
        metrics, report.end_problems = {}, [f"metrics at {metrics_url}: {type(exc).__name__}: {exc}"]
    report.end_state = {k: v for k, v in metrics.items()
                        if "engine" in k or "vocoder" in k or "heartbeat" in k or k.startswith("moss_tts_requests{")}
    return report


def main(argv=None, load: Load = load_in_process) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="localhost:8001")
    p.add_argument("--metrics-url", default="http://localhost:8002/metrics")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--cancel-fraction", type=float, default=0.2)
    p.add_argument("--bad-fraction", type=float, default=0.1)
    p.add_argument("--min-frames", type=int, default=6)
    p.add_argument("--max-frames", type=int, default=30)
    p.add_argument("--max-running", type=int, default=256, help="moss_tts max_running_requests summed over its instances (free slots when idle; 512 on replicas_2gpu)")
    p.add_argument("--settle", type=float, default=30.0)
    p.add_argument("--processes", type=int, default=1, help="client processes sharing the concurrency")
    p.add_argument("--response-timeout", type=float, default=120.0,
                   help="seconds a stream may wait for its next response before it is cancelled and failed")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    config = SoakConfig(args.url, args.concurrency, args.seconds, args.cancel_fraction, args.bad_fraction,
                        args.min_frames, args.max_frames, args.response_timeout)
    report = soak(config, args.metrics_url, args.max_running, args.settle, args.processes, load)
    summary = {"config": asdict(config), **report.summary()}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
