"""The soak's client processes: the load (soak_load.py) in several spawned processes, so one Python
process is not what limits hundreds of streams. A client process that dies is named in the report
with its exit code or signal, the others are told to stop, and every wait has a deadline
(tests/test_soak_clients.py).
"""

from __future__ import annotations

import multiprocessing
import signal
import time
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Optional

from perf.soak_load import Load, SoakConfig, SoakReport, load_in_process, say

STOP_GRACE_S = 15.0  # after the response timeout: read_to_end's 10 s to a stream's status, and slack
STARTUP_S = 60.0  # a spawned client process's imports and channel, on a loaded host
EXIT_S = 10.0  # seconds a client process that sent its report has to exit


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

