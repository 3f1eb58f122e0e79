"""The stub guard: no Python stub outlives its tritonserver, whatever state its threads are in.

`guard_stub()` (called once per stub, from triton_io.Heartbeat) starts stub_guard.sh beside the
stub: a bash process that SIGKILLs the stub within 0.2 s of tritonserver being gone (killed, or
exited at its exit timeout with this model still loaded). An orphaned stub holds its GPU memory,
so the next server on that GPU could not start. stub_guard.sh says why a process and not a thread
of the stub (it would need the stub's GIL) nor PR_SET_PDEATHSIG (it follows the forking thread).

`exit_with_server()` (also once per stub) is the fast path for a stub that can still run Python: a
thread that ends the stub with os._exit the moment tritonserver is gone (a pidfd of the parent,
readable once it exits; polling where pidfds are missing). The stub's own check (r24.10, every
300 ms: "Non-graceful termination detected") would instead destroy the stub's C++ state under the
Python threads still running (a gauge mid-IPC, a metric destructor) and crash with SIGSEGV;
os._exit runs no destructor. The guard process stays for the stub that cannot run Python.
No Triton import: tested without a server (tests/test_stub_guard.py) and with one.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

GUARD_SCRIPT = Path(__file__).with_name("stub_guard.sh")
PARENT_POLL_S = 0.02  # where no pidfd can be had: how often the parent is looked at

_guard: Optional[subprocess.Popen] = None
_exit_thread: Optional[threading.Thread] = None


def guard_stub() -> Optional[subprocess.Popen]:
    """Start the guard of this process (once), watching for its parent to change; returns it.
    Its own session, so a signal to the server's process group leaves it in place until it has
    done its job; it ends by itself once the stub is gone. None without /proc (not Linux)."""
    global _guard
    if _guard is None and Path("/proc/self/stat").exists():
        _guard = subprocess.Popen(["bash", str(GUARD_SCRIPT), str(os.getpid()), str(os.getppid())],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True,
                                  start_new_session=True)
    return _guard


def exit_with_server() -> threading.Thread:
    """Start (once) the thread that ends this process with os._exit(0) as soon as its parent, the
    tritonserver that started it, is gone; returns it."""
    global _exit_thread
    if _exit_thread is None:
        _exit_thread = threading.Thread(target=_wait_for_parent_then_exit, args=(os.getppid(),),
                                        name="moss-exit-with-server", daemon=True)
        _exit_thread.start()
    return _exit_thread


def _wait_for_parent_then_exit(parent: int) -> None:
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # an older kernel or a sandbox without pidfds
        fd = None
    if fd is not None and os.getppid() == parent:  # the pidfd is of our parent, not of a reused pid
        select.select([fd], [], [])  # no GIL held while waiting; readable once the parent has exited
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)
