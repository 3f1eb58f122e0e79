"""Start the OpenAI-compatible shim for tests: as a subprocess (the CLI, as scripts/serve.sh runs
it) or in-process on a thread (for one-off settings such as a tiny response timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# tests.triton_server, not triton_server: perf/bench_shim.py starts its shim here too, from the
# repository root (conftest puts it on sys.path); free_port keeps no state, so the module being
# imported under both names costs nothing.
from tests.triton_server import ROOT, free_port as _free_port


@dataclass
class ShimProcess:
    process: subprocess.Popen
    url: str
    log_path: Path
    reference_dir: Path

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def is_alive(self) -> bool:
        return self.process.poll() is None


def health_status(url: str) -> Optional[int]:
    try:
        return urllib.request.urlopen(f"{url}/health", timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def start_shim(grpc_url: str, log_path: Path, reference_dir: Path, *flags: str, timeout: float = 60.0,
               health: int = 200, workers: int = 1) -> ShimProcess:
    """The CLI on a free port with `workers` worker processes; returns once GET /health answers
    `health` (503: no tritonserver)."""
    port = _free_port()
    command = [sys.executable, "-m", "client.openai_shim", "--host", "127.0.0.1", "--port", str(port),
               "--triton-url", grpc_url, "--reference-dir", str(reference_dir), "--log-level", "warning",
               "--workers", str(workers), *flags]
    log = open(log_path, "w")
    # A session of its own: a shim that does not stop is killed with its workers (stop_shim).
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
                               start_new_session=True)
    shim = ShimProcess(process, f"http://127.0.0.1:{port}", log_path, reference_dir)
    deadline = time.monotonic() + timeout
    while health_status(shim.url) != health:
        if not shim.is_alive() or time.monotonic() > deadline:
            stop_shim(shim)
            raise RuntimeError(f"the OpenAI shim did not become healthy:\n{shim.log_tail()}")
        time.sleep(0.2)
    return shim


def stop_shim(shim: ShimProcess) -> None:
    """SIGTERM to the shim (its parent process passes it to every worker); SIGKILL to all of them
    after 30 s."""
    if shim.is_alive():
        shim.process.send_signal(signal.SIGTERM)
        try:
            shim.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(shim.process.pid, signal.SIGKILL)
            shim.process.wait()


class ShimThread:
    """The shim app served by uvicorn on a thread of the test process (`with ShimThread(config, fake) as
    url`), around a fake Triton client. Shims that stream from a real tritonserver run as subprocesses:
    after a grpc.aio stream on one event loop, servers on later loops of the same process saw false
    client disconnects (grpc.aio keeps process-wide state)."""

    def __init__(self, config, triton):
        from dataclasses import replace

        import uvicorn

        from client.openai_shim.app import create_app
        from client.openai_shim.workers import server_options

        self.port = _free_port()
        config = replace(config, host="127.0.0.1", port=self.port)
        self.server = uvicorn.Server(uvicorn.Config(create_app(config, triton), **server_options(config, "warning")))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "in-process shim did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        # The tests read the fake server's state after this: the server thread must be done with it.
        assert not self.thread.is_alive(), "the in-process shim did not stop within 30 s"
