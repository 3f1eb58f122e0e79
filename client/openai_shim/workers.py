"""The shim's processes: one event loop per worker process, all accepting on one port.

One Python process tops out at one core (the event loop and its GIL); `--workers N` runs N
uvicorn workers under uvicorn's own supervisor (uvicorn.supervisors.Multiprocess), each on its
own listening socket of the one port (SO_REUSEPORT: the kernel spreads new connections evenly;
SpreadWorkers says why not one shared socket). Each worker builds its own app from the picklable factory
`partial(create_app, config)` (no import string and no settings passed through the environment)
and so has its own gRPC channel to tritonserver and its own heartbeat watcher. Saved voices are
files under --voices-dir, written atomically (client/voices.py), so a voice created through one
worker is there for every other. SIGTERM to the parent reaches every worker as SIGTERM: each
stops accepting, gives its open responses GRACEFUL_SHUTDOWN_S, and exits; the parent then exits.
A worker that dies is started again by the supervisor. `--workers 1` is one process, as before.
"""

from __future__ import annotations

import math
import os
import socket
from functools import partial
from pathlib import Path

import uvicorn
from uvicorn.supervisors import Multiprocess

from .config import ShimConfig

GRACEFUL_SHUTDOWN_S = 10  # open streams get this long on SIGTERM, then they are cut (and cancelled)
MAX_DEFAULT_WORKERS = 8  # the default stops here: more workers than that is a choice (--workers)
CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP) -> float | None:
    """Cores this container may use by its CPU quota (a Kubernetes CPU limit, docker --cpus), or None:
    cgroup v2 `cpu.max` ("max 100000" = none, "400000 100000" = 4), else v1 cfs_quota_us / period."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cores(root: Path = CGROUP) -> int:
    """The cores this process may run on (its affinity), fewer where a CPU quota says so (rounded up)."""
    cores = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(root)
    return cores if limit is None else max(1, min(cores, math.ceil(limit)))


def default_workers(root: Path = CGROUP) -> int:
    return max(1, min(MAX_DEFAULT_WORKERS, usable_cores(root)))


def server_options(config: ShimConfig, log_level: str = "info") -> dict:
    """uvicorn's settings for the shim (also the in-process test server's, tests/shim_server.py)."""
    return dict(host=config.host, port=config.port, log_level=log_level,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                ws_max_size=config.max_body_bytes,  # the options may carry a reference
                # PCM barely compresses, and deflating every audio frame held the event loop (issue 31)
                ws_per_message_deflate=False)


def serve(config: ShimConfig, workers: int, log_level: str) -> None:
    """Run the shim until SIGTERM / SIGINT: in this process (workers == 1) or in `workers` processes."""
    from .app import create_app

    options = dict(server_options(config, log_level), factory=True)
    factory = partial(create_app, config)
    if workers == 1:
        uvicorn.run(factory, **options)
        return
    # uvicorn.run() takes only an import string with workers; its supervisor itself takes any
    # picklable app: the factory travels to each spawned worker with the validated config.
    SpreadWorkers(uvicorn.Config(factory, workers=workers, **options), sockets=[]).run()


class SpreadWorkers(Multiprocess):
    """uvicorn's supervisor, each worker listening on a socket of its own (SO_REUSEPORT), so that
    the kernel spreads new connections over the workers by their addresses' hash.

    Why not uvicorn's one shared socket: every worker's event loop woke at each new connection and
    the first to run accepted the whole burst (asyncio accepts up to `backlog` connections per
    wake-up). 128 WebSocket sessions opened at once went 109 / 10 / 7 / 2 to 4 workers; on the H200
    the one loop that served most of them added 75 ms to first audio at 128 sessions (issue 31)."""

    @property
    def sockets(self) -> list[socket.socket]:
        # Multiprocess reads self.sockets each time it starts a worker (at start, when it replaces
        # a dead one, at SIGTTIN): each gets a new socket. The parent keeps none: multiprocessing
        # drops a worker's start arguments once it is spawned, so the parent's copy closes and
        # no connection is ever given to a socket nobody accepts on (tests/test_openai_shim_workers.py).
        sock = worker_socket(self.config)
        self.config.port = sock.getsockname()[1]  # port 0: every later worker joins the first's
        return [sock]

    @sockets.setter
    def sockets(self, _given) -> None:
        pass  # Multiprocess.__init__ stores one list for all workers; each makes its own instead


def worker_socket(config) -> socket.socket:
    """One worker's listening socket on the shim's port. SO_REUSEPORT puts it in the port's group
    beside the other workers'. TCP_NODELAY, which Linux copies to every connection it accepts:
    without it, back-to-back responses' first audio, written right after their headers, waited for
    the client's delayed ACK, +40 ms (issue 31); asyncio would not set it, since uvicorn's sockets
    said protocol 0 (base_events._set_nodelay)."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((config.host, config.port))
        sock.listen(config.backlog)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock
