"""The stub guard (serving/stub_guard.py + stub_guard.sh) without a server: a "server" process
starts a "stub" that starts its guard, as a Triton stub does; the stub is stopped (SIGSTOP: none
of its threads can run, the state a held GIL or a blocked IPC call leaves a stub in) and the
server is killed; the guard must end the stub within 2 s. And it must leave a stub alone while
its server lives, and end by itself when the stub ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUB = """
import sys, time
sys.path.insert(0, {backends!r})
from moss_tts.serving.stub_guard import guard_stub
guard = guard_stub()
print(guard.pid, flush=True)
time.sleep({life})
"""
# A stub with no guard process, only the thread that exits with its server (and one that keeps
# the GIL busy, as the engine's threads do): it must end by itself.
EXITING_STUB = """
import sys, threading, time
sys.path.insert(0, {backends!r})
from moss_tts.serving.stub_guard import exit_with_server
exit_with_server()
threading.Thread(target=lambda: sum(i for i in iter(int, 1)), daemon=True).start()
print(0, flush=True)
time.sleep({life})
"""
SERVER = """
import subprocess, sys, time
stub = subprocess.Popen([sys.executable, "-c", {stub!r}], stdout=subprocess.PIPE, text=True)
print(stub.pid, stub.stdout.readline().strip(), flush=True)
time.sleep(120)
"""

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the guard reads /proc (Linux)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _start(stub_life: float = 120, stub_code: str = STUB):
    stub = stub_code.format(backends=str(ROOT / "python_backends"), life=stub_life)
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(stub=stub)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    stub_pid, guard_pid = (int(x) for x in server.stdout.readline().split())
    return server, stub_pid, guard_pid


def _cleanup(server, *pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.kill()
    server.wait()


def test_a_stopped_stub_dies_within_two_seconds_of_its_server():
    server, stub, guard = _start()
    try:
        time.sleep(0.5)
        assert _alive(stub) and _alive(guard)  # the server lives: the guard leaves the stub alone
        os.kill(stub, signal.SIGSTOP)  # no thread of the stub can run any more
        server.kill()  # the server alone, as when tritonserver is killed: its stubs stay
        server.wait()
        assert _wait_gone(stub, 2.0), "the stub outlived its server by 2 s"
        assert _wait_gone(guard, 2.0), "the guard did not end after its stub"
    finally:
        _cleanup(server, stub, guard)


def test_the_guard_ends_with_its_stub_and_spares_a_live_one():
    server, stub, guard = _start(stub_life=1.0)
    try:
        assert _wait_gone(stub, 5.0)  # the stub ends by itself after 1 s
        assert _wait_gone(guard, 2.0), "the guard outlived its stub"
        assert server.poll() is None  # nothing killed the server
    finally:
        _cleanup(server, stub, guard)


def test_a_running_stub_exits_by_itself_with_its_server():
    """exit_with_server: the stub ends itself (os._exit, no destructor) the moment its server is
    gone, before r24.10's own 300 ms check would tear its C++ state down under its threads."""
    server, stub, _ = _start(stub_code=EXITING_STUB)
    try:
        time.sleep(0.5)
        assert _alive(stub)  # the server lives
        server.kill()
        server.wait()
        assert _wait_gone(stub, 1.0), "the stub outlived its server by 1 s with no guard to kill it"
    finally:
        _cleanup(server, stub)
