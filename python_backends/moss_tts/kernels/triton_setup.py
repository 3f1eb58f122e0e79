"""What every Triton kernel of this package sets up the same way, written once.

triton is optional: on a GPU-less install `triton` is None and each kernel's caller runs its torch
reference instead (every kernel module has an `is_supported` that asks `triton` and `INTERPRET`).
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # GPU-less installs: the torch references run
    triton = None
    tl = None

LOG2E = 1.4426950408889634  # softmax in exp2: exp(x) = exp2(x * LOG2E)
# triton.jit picks the interpreter when it decorates, so the env var is read once, like Triton does
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
jit = triton.jit if triton is not None else (lambda fn: fn)
