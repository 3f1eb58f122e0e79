"""Start the real tritonserver (scripts/serve.sh) once per test session, on free ports."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("ref_encoder", "vocoder", "moss_tts_codes", "moss_tts")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_free_port = free_port  # the name the shim's tests import
GAUGE_FRESH_S = 1.0  # twice the slowest gauge refresh (0.5 s, moss_tts model.py): a read then shows newer values


@dataclass
class TritonServer:
    process: subprocess.Popen
    grpc_url: str
    http_url: str
    metrics_url: str
    log_path: Path
    stubs: dict[str, int] = field(default_factory=dict)  # its Python stubs once ready (stub_pids)
    crashes_checked: bool = False

    def metrics(self) -> dict[str, float]:
        """Our custom series, e.g. {'moss_engine{stat="running"}': 0.0}."""
        from perf.soak_metrics import read_metrics

        return read_metrics(self.metrics_url)

    def wait_for_metrics(self, predicate, timeout: float = 30.0, fresh: bool = False) -> dict[str, float]:
        """Poll the metrics endpoint until predicate(metrics) holds; fresh: on reads begun GAUGE_FRESH_S
        after this call only (gauges refresh every 0.25-0.5 s: a read at once may predate the work)."""
        deadline, fresh_from = time.monotonic() + timeout, time.monotonic() + (GAUGE_FRESH_S if fresh else 0.0)
        while True:
            is_fresh = time.monotonic() >= fresh_from  # before the read: the gauges it sees are newer
            values = self.metrics()
            if (is_fresh and predicate(values)) or time.monotonic() > deadline:
                return values
            time.sleep(0.1)

    def settled_metrics(self, timeout: float = 10.0) -> dict[str, float]:
        """The series once two reads 0.6 s apart agree: the gauge threads publish what earlier
        requests (another test's) recorded up to ~0.5 s after their final responses."""
        def work(values):  # the heartbeats count up all the time
            return {k: v for k, v in values.items() if not k.startswith("moss_heartbeat")}

        previous, deadline = self.metrics(), time.monotonic() + timeout
        while True:
            time.sleep(0.6)
            values = self.metrics()
            if work(values) == work(previous) or time.monotonic() > deadline:
                return values
            previous = values

    def model_config(self, model: str) -> dict:
        url = f"http://{self.http_url}/v2/models/{model}/config"
        return json.loads(urllib.request.urlopen(url, timeout=10).read())

    def parameter(self, model: str, key: str) -> int:
        return int(self.model_config(model)["parameters"][key]["string_value"])

    def is_idle(self, m: dict[str, float]) -> bool:
        """No stream, no engine row, no vocoder session in use (metrics as from `metrics()`)."""
        from perf.soak_metrics import idle_problems

        return not idle_problems(m, self.parameter("moss_tts", "max_running_requests"))

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def is_alive(self) -> bool:
        return self.process.poll() is None


# tritonserver 2.51's Python backend sometimes aborts while it creates a stub's shared memory
# (triton-inference-server/server#8882, open upstream; seen here once at start-up, with another
# server starting on the same 2 cores). It kills the whole server before any of our code runs a
# request, so a start-up that died of it is tried once more; the first log is kept beside.
UPSTREAM_START_ABORT = "boost::interprocess::lock_exception"


class ServerStartAborted(RuntimeError):
    """The server died at start-up of UPSTREAM_START_ABORT."""


def start_server(model_dir: Path, codec_dir: Path, log_path: Path, timeout: float = 240.0,
                 repository: Path | None = None, args: tuple[str, ...] = ()) -> TritonServer:
    """tritonserver through scripts/serve.sh (its flags + `args`), ready to serve."""
    try:
        return _start_server(model_dir, codec_dir, log_path, timeout, repository, args)
    except ServerStartAborted:
        kept = log_path.with_suffix(".aborted.log")
        log_path.replace(kept)
        print(f"tritonserver aborted at start-up ({UPSTREAM_START_ABORT}, upstream #8882); starting it again "
              f"(first log: {kept})")
        return _start_server(model_dir, codec_dir, log_path, timeout, repository, args)


def _start_server(model_dir: Path, codec_dir: Path, log_path: Path, timeout: float,
                  repository: Path | None, args: tuple[str, ...]) -> TritonServer:
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ, MOSS_TTS_MODEL_DIR=str(model_dir), MOSS_TTS_CODEC_DIR=str(codec_dir),
               HTTP_PORT=str(http), GRPC_PORT=str(grpc), METRICS_PORT=str(metrics),
               SHIM_PORT="0")  # tritonserver only; tests start the OpenAI shim themselves (openai_shim fixture)
    if repository is not None:
        env["MODEL_REPOSITORY"] = str(repository)
    server = spawn([str(ROOT / "scripts" / "serve.sh"), *args], env, log_path, http, grpc, metrics)
    try:
        wait_ready(server, MODELS, timeout)
    except RuntimeError:
        if server.is_alive():  # not ready in time
            stop_server(server)
        raise
    server.stubs = stub_pids(server)
    with _started_lock:
        _started.append(server)
    return server


def spawn(command: list[str], env: dict[str, str], log_path: Path, http: int, grpc: int, metrics: int) -> TritonServer:
    """Start `command` (tritonserver, or a script that execs it, serving on these ports) in a
    session of its own, its output in `log_path`. perf/hold_repro/repro.py starts its servers here too."""
    log = open(log_path, "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return TritonServer(process, f"127.0.0.1:{grpc}", f"127.0.0.1:{http}", f"http://127.0.0.1:{metrics}/metrics",
                        log_path)


def wait_ready(server: TritonServer, models, timeout: float) -> None:
    """Until every model of `models` is ready; RuntimeError (ServerStartAborted for upstream's
    start-up abort) when the server exits first or is not ready in `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not is_ready(server, models):
        if not server.is_alive():
            tail = server.log_tail()
            error = ServerStartAborted if UPSTREAM_START_ABORT in tail else RuntimeError
            raise error(f"tritonserver exited during start-up:\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"tritonserver not ready after {timeout:.0f} s:\n{server.log_tail()}")
        time.sleep(0.5)


def is_ready(server: TritonServer, models=MODELS) -> bool:
    try:
        for model in models:
            url = f"http://{server.http_url}/v2/models/{model}/ready"
            if urllib.request.urlopen(url, timeout=2).status != 200:
                return False
        return True
    except OSError:
        return False


def stop_server(server: TritonServer, timeout: float = 60.0, check_crashes: bool = True,
                kill_leftovers: bool = False) -> float:
    """SIGTERM, wait; returns the seconds it took (SIGKILL and inf if it did not exit in time).
    `kill_leftovers`: SIGKILL what is left of its process group after (a crashed server's stubs);
    `check_crashes`: assert no stub of it crashed (repros that expect crashes say False)."""
    start = time.monotonic()
    took = 0.0
    if server.is_alive():
        os.killpg(server.process.pid, 15)
        try:
            server.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, 9)
            server.process.wait()
            took = float("inf")
    took = took or time.monotonic() - start
    if kill_leftovers:
        try:
            os.killpg(server.process.pid, 9)
        except ProcessLookupError:
            pass
    if check_crashes:
        assert_no_stub_crash(server)
    return took


# How a stub ended is read two ways. Every stub enables Python's faulthandler (triton_io.prepare_stub),
# which writes "Fatal Python error: <signal>" and the threads' stacks into the server log, which
# the stub shares. The kernel log names a crashed process by its pid (`triton_python_b[PID]:
# segfault at ...`) for a crash faulthandler cannot report (one before the model imported our code,
# or a stub of another model); it is read where `dmesg` can be, and the run says when it cannot.
STUB_CRASH_LOG_LINE = "Fatal Python error"
_started_lock = threading.Lock()
_started: list[TritonServer] = []  # every server started in this test session, checked once it has exited
kernel_log_problem: list[str] = []  # why dmesg could not be read (shown in the run's summary)


def kernel_log() -> str | None:
    """The kernel log, or None (and the reason kept in kernel_log_problem) where it cannot be read."""
    try:
        result = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        result, reason = None, str(exc)
    else:
        reason = result.stderr.strip() or f"exit status {result.returncode}"
    if result is not None and result.returncode == 0:
        return result.stdout
    with _started_lock:
        if not kernel_log_problem:
            kernel_log_problem.append(f"dmesg: {reason}")
    return None


def stub_crashes(server: TritonServer) -> list[str]:
    """The lines that say a stub of this server crashed: its log's faulthandler reports and the
    kernel's lines for its stubs' pids."""
    lines = [line for line in server.log_path.read_text(errors="replace").splitlines() if STUB_CRASH_LOG_LINE in line]
    kernel = kernel_log()
    if kernel is not None:
        tags = [f"triton_python_b[{pid}]" for pid in server.stubs.values()]
        lines += [line for line in kernel.splitlines() if any(tag in line for tag in tags)]
    return lines


def assert_no_stub_crash(server: TritonServer) -> None:
    """Once the server has exited: no stub of it crashed (checked once per server)."""
    if server.crashes_checked or server.is_alive():
        return
    server.crashes_checked = True
    crashes = stub_crashes(server)
    assert not crashes, (f"a Python stub of this tritonserver crashed (stubs {server.stubs}; log {server.log_path}):\n"
                         + "\n".join(crashes) + "\n--- log tail ---\n" + server.log_tail(40))


def check_exited_servers() -> None:
    """assert_no_stub_crash for every server of this session that has exited (conftest runs it
    after each test, so a test that stops its server its own way is checked too)."""
    with _started_lock:
        exited = [s for s in _started if not s.crashes_checked and not s.is_alive()]
    for server in exited:
        assert_no_stub_crash(server)


def copy_repository(tmp: Path, **parameters: dict[str, str]) -> Path:
    """model_repository/ copied to `tmp`, with some pbtxt parameters changed:
    copy_repository(tmp, moss_tts={"max_streams": "2"})."""
    import shutil

    repo = tmp / "model_repository"
    shutil.copytree(ROOT / "model_repository", repo)
    for model, values in parameters.items():
        config = repo / model / "config.pbtxt"
        text = config.read_text()
        for key, value in values.items():
            text, n = re.subn(rf'(key: "{key}" value: {{ string_value: ")[^"]*(")', rf"\g<1>{value}\g<2>", text)
            assert n == 1, f"{model} has no parameter {key}"
        config.write_text(text)
    return repo


def stub_pids(server: TritonServer) -> dict[str, int]:
    """{model instance name: pid} of this server's Python stubs (its child processes)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(server.process.pid)], capture_output=True, text=True).stdout
    stubs = {}
    for pid in out.split():
        try:  # /proc, not ps: ps cuts long command lines to the terminal width
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"triton_python_backend_stub"):
            stubs[args[-3].decode()] = int(pid)  # [..., instance name, "DEFAULT", ""]
    return stubs


def live_stubs(stubs: dict[str, int], wait_s: float = 5.0) -> dict[str, int]:
    """Those of `stubs` ({name: pid}, from stub_pids) still running after up to `wait_s` seconds:
    a stub whose tritonserver is gone is killed by its guard within 0.2 s (serving/stub_guard.py)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = {name: pid for name, pid in stubs.items() if _is_running(pid)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False
