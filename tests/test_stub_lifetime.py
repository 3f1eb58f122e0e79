"""No Python stub outlives tritonserver, whatever state its threads are in (issue 20): under load,
with the `moss_tts` stub stopped (SIGSTOP: no thread of it can run, as with a GIL held forever or
an IPC call that never returns), every stub is gone 2 s after tritonserver is SIGKILLed, and 2 s
after tritonserver gives up at its exit timeout with a dead sibling stub (or, when tritonserver
crashes in that exit and hangs, 2 s after it is killed). Each stub's guard
(serving/stub_guard.py) does it; tests/test_stub_guard.py tests the guard without a server."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from client.tts_client import InferenceServerException, TTSClient, build_inputs
from triton_server import live_stubs, start_server, stub_pids

pytestmark = pytest.mark.triton
GONE_S = 2.0


def load(server, streams: int = 4) -> list[threading.Thread]:
    """Streams running when the server is taken down (their errors are expected)."""
    started = threading.Barrier(streams + 1)

    def stream(i: int) -> None:
        try:
            for n, _ in enumerate(TTSClient(server.grpc_url).stream(
                    build_inputs("Speak on.", max_frames=1900, ignore_stop=True, seed=i), timeout=60)):
                if n == 0:
                    started.wait(timeout=60)
        except (InferenceServerException, threading.BrokenBarrierError):
            pass

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    started.wait(timeout=120)
    return threads


def guards_started(stubs: dict[str, int]) -> None:
    """Every stub has its guard (a child running stub_guard.sh) before the test pulls the plug."""
    for name, pid in stubs.items():
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        cmdlines = [open(f"/proc/{c}/cmdline", "rb").read() for c in children]
        assert any(b"stub_guard.sh" in c for c in cmdlines), f"{name} (pid {pid}) has no guard"


def kill_all(stubs: dict[str, int]) -> None:
    """Whatever the test left running (a stub the guard missed is the failure, not the cleanup)."""
    for pid in stubs.values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def loaded_server(tiny_dir, tmp_path, *args: str):
    """A server with streams running and every stub guarded: (server, its stubs)."""
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp_path / "server.log", args=args)
    stubs = stub_pids(server)
    try:
        guards_started(stubs)
        load(server)
    except BaseException:
        kill_all(stubs)
        raise
    return server, stubs


def test_no_stub_outlives_a_sigkilled_server_even_a_stopped_one(tiny_dir, tmp_path):
    server, stubs = loaded_server(tiny_dir, tmp_path)
    try:
        os.kill(stubs["moss_tts_0_0"], signal.SIGSTOP)
        os.kill(server.process.pid, signal.SIGKILL)  # tritonserver alone: serve.sh exec'd it
        server.process.wait()
        alive = live_stubs(stubs, wait_s=GONE_S)
        assert not alive, f"stubs alive {GONE_S} s after tritonserver was killed: {alive}"
    finally:
        kill_all(stubs)


def test_no_stub_outlives_an_exit_timeout_with_a_dead_sibling(tiny_dir, tmp_path):
    server, stubs = loaded_server(tiny_dir, tmp_path, "--exit-timeout-secs=3")
    try:
        os.kill(stubs["vocoder_0_0"], signal.SIGKILL)  # a dead sibling
        os.kill(stubs["moss_tts_0_0"], signal.SIGSTOP)  # it cannot unload: Triton waits out its timeout
        os.killpg(server.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while "Exit timeout expired" not in server.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        # Triton gave up on it; the held stub runs again (as a stub whose GIL holder lets go late),
        # and tritonserver, which waits for a stopped stub forever, can end.
        os.kill(stubs["moss_tts_0_0"], signal.SIGCONT)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # tritonserver 2.51 sometimes crashes in its own "exiting immediately" path as the
            # resumed stub's messages reach it (log: "Signal (11) received", a corrupt heap), then
            # hangs in its crash handler (~1 run in 5 here): an upstream defect, not the stubs'.
            # What this test owns must still hold: once tritonserver is gone, so are the stubs.
            after = server.log_path.read_text(errors="replace").split("Exit timeout expired", 1)[-1]
            assert "Signal (11) received" in after or "Signal (6) received" in after, server.log_tail()
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()
        exited = time.monotonic()
        alive = live_stubs(stubs, wait_s=GONE_S)
        assert not alive, f"stubs alive {time.monotonic() - exited:.1f} s after tritonserver exited: {alive}"
    finally:
        kill_all(stubs)
