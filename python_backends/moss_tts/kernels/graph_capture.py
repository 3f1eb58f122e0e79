"""One CUDA graph captured with Python's cyclic collector held off.

Why: freeing a CUDA graph resets it, and a reset while any stream of the process is capturing
invalidates that capture (CUDA: "operation not permitted when stream is capturing", then
cudaErrorStreamCaptureInvalidated at the capture's end). A graph that sits in an unreachable
reference cycle (an engine or vocoder let go without `destroy()`, a failed capture's traceback)
is freed by whichever collection runs next, and a capture allocates enough Python objects to
trigger one. torch.cuda.graph no longer collects on entry (torch.compiler.config.
force_cudagraph_gc is off by default), so such a cycle can die mid-capture: on the H200 (round 17,
2026-12-05) a GPU test's capture failed this way while an earlier test's engine was collected
("function reset" warnings, then a cuBLAS failure in the capture).

While any thread captures, the collector is off (from before the capture begins to after it
ends): no collection starts then; the last capture to end turns it back on if it was on before
the first began. Acyclic garbage is still freed by its refcount at once: only cycles wait, for the
seconds the captures take. Not covered: a collection another thread had already started, whose
finalizers give up the GIL, or an explicit gc.collect() on another thread; in the stubs both
gc.collect() calls run on the loading thread, and nothing defines a finalizer (a helper's review,
round 17).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Callable, Iterator, Optional

import torch

_lock = threading.Lock()
_capturing = 0  # captures in progress, in every thread
_was_enabled = False  # the collector's state before the first of them


@contextlib.contextmanager
def collector_held_off() -> Iterator[None]:
    """Python's cyclic collector off for the block (and for as long as any other such block runs)."""
    global _capturing, _was_enabled
    with _lock:
        if _capturing == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _capturing += 1
    try:
        yield
    finally:
        with _lock:
            _capturing -= 1
            if _capturing == 0 and _was_enabled:
                gc.enable()


def capture_graph(fn: Callable[[], None], pool, stream: Optional[torch.cuda.Stream] = None) -> torch.cuda.CUDAGraph:
    """`fn`'s kernels as a new CUDA graph in `pool` (captured on `stream`, torch's own when None).
    The caller warms `fn` up and synchronizes first."""
    graph = torch.cuda.CUDAGraph()
    with collector_held_off(), torch.cuda.graph(graph, pool=pool, stream=stream):
        fn()
    return graph
