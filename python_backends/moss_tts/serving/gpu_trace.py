"""GpuTrace: on request, a few seconds of this process's GPU kernels, for the served GPU budget.

Why in the stub: under the mixed soak the engine's step takes ~22 ms of wall time against ~8.7 ms
alone, and the vocoder's rounds twice their time alone (issue 34, round 12). Only a timeline of
the served process shows what the GPU ran meanwhile (the steps, prefill, the rounds) and whether
it was ever idle. perf/gpu_trace_budget.py turns a trace into that budget.

Off unless the environment names a directory in MOSS_GPU_TRACE_DIR. Then one daemon thread looks
there once a second for a file `request`, written whole (by a rename). Its text is `[SECONDS
[NAME]]`: the seconds to record (0.1-30, default 2) and the answer's name (letters, digits, `._-`;
default `trace-PID-K`). The first instance to see the request takes it (renames it to its own
name, so a request that comes while it records waits for it, and two instances never both answer).
It records every CUDA kernel this process runs meanwhile, on every stream and thread
(torch.profiler's CUDA activity over CUPTI; no CPU ops, so nothing per op on the serving
threads), and writes `NAME.json.gz` (a Chrome trace, renamed into place whole) or `NAME.error`.
Writing a trace takes the GIL for a while (a 1.5 s trace of the H200 soak stalled the stub for
~10 s): the traced window is the load, the seconds after it are not. A failure is logged and
answered; serving goes on. `stop` ends a recording at once, without writing it.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Callable, Optional

log = logging.getLogger(__name__)
ENV = "MOSS_GPU_TRACE_DIR"
DEFAULT_SECONDS, MAX_SECONDS = 2.0, 30.0
NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")


class Stopped(Exception):
    """The trace was stopped (the model unloads) before its seconds were up: nothing is written."""


def record_cuda(seconds: float, path: Path, wait: Callable[[float], bool]) -> None:
    """Every CUDA kernel of this process for `seconds`, as a Chrome trace at `path`. `wait(s)` sleeps
    up to s and returns True when the trace must stop (Stopped, nothing exported)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        stopped = wait(seconds)
    if stopped:
        raise Stopped()
    prof.export_chrome_trace(str(path))


def parse_request(text: str, default_name: str) -> tuple[float, str]:
    """A request's `[SECONDS [NAME]]`; ValueError names what is wrong."""
    words = text.split()
    if len(words) > 2:
        raise ValueError(f"a GPU trace request is '[SECONDS [NAME]]', not {text.strip()!r}")
    seconds = float(words[0]) if words else DEFAULT_SECONDS
    if not 0.1 <= seconds <= MAX_SECONDS:
        raise ValueError(f"a GPU trace records 0.1-{MAX_SECONDS:g} s, not {seconds:g}")
    name = words[1] if len(words) > 1 else default_name
    if not NAME.fullmatch(name):
        raise ValueError(f"a GPU trace's name is letters, digits and '._-' (at most 100), not {name!r}")
    return seconds, name


class GpuTrace:
    """The request-file watcher (`from_env`); inert (no thread) without a usable directory."""

    def __init__(self, directory: Optional[Path], poll_s: float = 1.0,
                 record: Callable[[float, Path, Callable[[float], bool]], None] = record_cuda) -> None:
        self.directory, self.poll_s, self._record = directory, poll_s, record
        self.traces = 0  # requests taken (answered with a trace or an error), this thread's count
        self._stop = threading.Event()
        self.thread = None
        if directory is None:
            return
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a diagnostic never keeps the model from loading
            log.warning("GPU traces off: %s %s: %s", ENV, directory, exc)
            self.directory = None
            return
        self.thread = threading.Thread(target=self._loop, name="moss-gpu-trace", daemon=True)
        self.thread.start()

    @classmethod
    def from_env(cls) -> "GpuTrace":
        directory = os.environ.get(ENV, "").strip()
        return cls(Path(directory) if directory else None)

    def stop(self, timeout: float = 5.0) -> None:
        """No trace starts after this, and one being recorded ends unwritten; one being written is
        waited for up to `timeout`."""
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout)

    def _loop(self) -> None:
        request, problem = self.directory / "request", None
        while not self._stop.wait(self.poll_s):
            taken = self.directory / f"request.{os.getpid()}"
            try:
                request.rename(taken)  # this instance's now: a newer request waits for the next look
                text = taken.read_text()
                taken.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:  # e.g. `request` is a directory: said once, not every second
                if str(exc) != problem:
                    log.warning("GPU trace request unusable: %s", exc)
                problem = str(exc)
                continue
            default = f"trace-{os.getpid()}-{self.traces}"
            self.traces += 1
            self._answer(text, default)

    def _answer(self, text: str, default: str) -> None:
        words = text.split()  # the answer keeps the name asked for, whatever else is wrong
        name = words[1] if len(words) == 2 and NAME.fullmatch(words[1]) else default
        try:
            seconds, name = parse_request(text, default)
            self._write(seconds, name)
        except Stopped:
            log.info("GPU trace %s stopped unwritten: the model unloads", name)
        except Exception as exc:  # a diagnostic: never the server's failure
            log.exception("GPU trace %s failed", name)
            try:
                (self.directory / f"{name}.error").write_text(f"{type(exc).__name__}: {exc}\n")
            except OSError:
                log.exception("GPU trace %s: its error could not be written", name)

    def _write(self, seconds: float, name: str) -> None:
        raw, packed = self.directory / f"{name}.json", self.directory / f"{name}.json.gz.partial"
        try:
            log.info("GPU trace %s: recording %.1f s", name, seconds)
            self._record(seconds, raw, self._stop.wait)
            with raw.open("rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            # Renamed whole: a reader that waits for NAME.json.gz never sees it half-written
            # (round 12's first traces were read while gzip still wrote them, and lost).
            packed.rename(self.directory / f"{name}.json.gz")
            log.info("GPU trace %s written", name)
        finally:
            raw.unlink(missing_ok=True)
            packed.unlink(missing_ok=True)
