"""The stub guard: no Python stub outlives its tritonserver, whatever state its threads are in.

`guard_stub()` (called once per stub, from triton_io.Heartbeat) starts stub_guard.sh beside the
stub: a bash process that SIGKILLs the stub within 0.2 s of tritonserver being gone (killed, or
exited at its exit timeout with this model still loaded). An orphaned stub holds its GPU memory,
so the next server on that GPU could not start. stub_guard.sh says why a process and not a thread
of the stub (it would need the stub's GIL) nor PR_SET_PDEATHSIG (it follows the forking thread).
No Triton import: tested without a server (tests/test_stub_guard.py) and with one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

GUARD_SCRIPT = Path(__file__).with_name("stub_guard.sh")

_guard: Optional[subprocess.Popen] = None


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
