"""GpuTrace: on request, a few seconds of this process's GPU kernels, for the served GPU budget.

Why in the stub: under the mixed soak the engine's step takes ~22 ms of wall time against ~8.7 ms
alone, and the vocoder's rounds twice their time alone (issue 34, round 12). Only a timeline of
the served process shows what the GPU ran meanwhile (the steps, prefill, the rounds) and whether
it was ever idle. perf/gpu_trace_budget.py turns a trace into that budget.

Off unless the environment names a directory in MOSS_GPU_TRACE_DIR. Then one daemon thread looks
there once a second for a file `request` (its text: the seconds to record, 0.1-30, default 2;
written whole, by a rename, so that it is never read half-written), records every CUDA kernel
this process runs meanwhile, on every stream and thread (torch.profiler's CUDA activity over
CUPTI; no CPU ops, so nothing per op on the serving threads), writes `trace-K.json.gz` (a Chrome
trace), then removes the request. Exporting takes the GIL for
a while: the traced seconds and the export are not representative of the load, the window is.
A failure is logged and answered with `trace-K.error`; serving goes on.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Optional

log = logging.getLogger(__name__)
ENV = "MOSS_GPU_TRACE_DIR"
DEFAULT_SECONDS, MAX_SECONDS = 2.0, 30.0


def record_cuda(seconds: float, path: Path) -> None:
    """Every CUDA kernel of this process for `seconds`, as a Chrome trace at `path`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        time.sleep(seconds)
    prof.export_chrome_trace(str(path))


def requested_seconds(text: str) -> float:
    """The request file's text: seconds to record (empty: the default); ValueError names the range."""
    seconds = float(text.strip()) if text.strip() else DEFAULT_SECONDS
    if not 0.1 <= seconds <= MAX_SECONDS:
        raise ValueError(f"a GPU trace records 0.1-{MAX_SECONDS:g} s, not {seconds:g}")
    return seconds


class GpuTrace:
    """The request-file watcher (`from_env`); inert (no thread) when no directory is named."""

    def __init__(self, directory: Optional[Path], poll_s: float = 1.0,
                 record: Callable[[float, Path], None] = record_cuda) -> None:
        self.directory, self.poll_s, self._record = directory, poll_s, record
        self.traces = 0  # answered requests (traces and errors), this thread's count
        self._stop = threading.Event()
        self.thread = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self.thread = threading.Thread(target=self._loop, name="moss-gpu-trace", daemon=True)
            self.thread.start()

    @classmethod
    def from_env(cls) -> "GpuTrace":
        directory = os.environ.get(ENV, "").strip()
        return cls(Path(directory) if directory else None)

    def stop(self, timeout: float = 5.0) -> None:
        """No trace starts after this; one being recorded or written is waited for up to `timeout`."""
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout)

    def _loop(self) -> None:
        request = self.directory / "request"
        while not self._stop.wait(self.poll_s):
            try:
                text = request.read_text()
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("GPU trace request unreadable: %s", exc)
                continue
            name = f"trace-{self.traces}"
            self.traces += 1
            try:
                self._write(requested_seconds(text), name)
            except Exception as exc:  # a diagnostic: never the server's failure
                log.exception("GPU trace %s failed", name)
                (self.directory / f"{name}.error").write_text(f"{type(exc).__name__}: {exc}\n")
            finally:
                request.unlink(missing_ok=True)

    def _write(self, seconds: float, name: str) -> None:
        raw, packed = self.directory / f"{name}.json", self.directory / f"{name}.json.gz.partial"
        log.info("GPU trace %s: recording %.1f s", name, seconds)
        self._record(seconds, raw)
        with raw.open("rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        # Renamed whole: a reader that waits for trace-K.json.gz never sees it half-written
        # (round 12's first traces were read while gzip still wrote them, and lost).
        packed.rename(self.directory / f"{name}.json.gz")
        log.info("GPU trace %s written", name)
