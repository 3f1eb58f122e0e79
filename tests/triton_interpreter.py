"""Run a test module's `interpreter_main` under Triton's interpreter, in a subprocess.

TRITON_INTERPRET must be set before triton is imported, so the kernels' CPU tests run their
cases in one child process each and read its last stdout line (JSON) back. Also the kernel tests'
shared error measure, `relative_error` (computed in the child, compared in the parent).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_interpreter_main(module: str, args: str = "", timeout_s: float = 300) -> str:
    """`module.interpreter_main(args)` with TRITON_INTERPRET=1 -> its stdout. Skips the calling
    test when triton is not installed; fails it with the child's stderr when the child fails."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernels cannot run, even in the interpreter")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "python_backends"), str(ROOT / "tests")])}
    proc = subprocess.run([sys.executable, "-c", f"import {module} as t; t.interpreter_main({args})"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def interpreter_json(module: str, timeout_s: float = 300):
    """The JSON `module.interpreter_main()` printed last."""
    return json.loads(run_interpreter_main(module, timeout_s=timeout_s).strip().splitlines()[-1])


def relative_error(got, expected) -> float:
    """max |got - expected| / max |expected| of two tensors, in fp32."""
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
