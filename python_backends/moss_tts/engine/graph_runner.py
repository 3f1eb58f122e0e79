"""GraphRunner: CUDA graphs of the whole decode step and of single-prompt prefills.

One graph per (batch bucket, KV window) covers a full decode step — backbone, stop decision,
12 codebooks with feedback, sampling and the state updates — and one per prompt-length bucket
covers a single prompt's prefill + first frame (and, with prefix reuse on, one per length of
the rows left after a reused prefix and key window); one per (prompts, rows, key window) bucket
covers a batched prefill (Buckets.batch_prefill_shapes). The decode step reads only persistent
slot state, so its graphs have no inputs; a prefill graph keeps its own static PrefillInputs.
Graphs are captured largest first into one memory pool, so smaller ones reuse its blocks.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import torch

from ..kernels.graph_capture import capture_graph
from .buckets import Buckets
from .step import PrefillInputs

log = logging.getLogger(__name__)


REMEDIES = ("Remedies: 1) set enforce_eager=true to serve without graphs; 2) set fuse_kernels=false "
            "if the error names torch.compile or Inductor, attention_kernel=false and "
            "sampler_kernel=false or qkv_kernels=false if it names a Triton kernel (_split_kernel, "
            "_combine_kernel, _draw_kernel, _decode_qkv_kernel, _local_attention_kernel: they were built "
            "against Triton 3.6); 3) lower cuda_graph_max_batch or "
            "max_seq_len if memory ran out.")


class GraphCaptureError(RuntimeError):
    """Warm-up or capture failed; the message lists what to try."""


class GraphRunner:
    def __init__(self, buckets: Buckets) -> None:
        self.buckets = buckets
        self._decode: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        # (prompts, rows, key window; 0 = no reused prefix) -> graph and its static inputs
        self._prefill: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, PrefillInputs]] = {}
        self._pool = None

    @property
    def num_graphs(self) -> int:
        return len(self._decode) + len(self._prefill)

    def capture(self, decode: Callable[[int, int], None], prefill: Callable[[PrefillInputs], None],
                make_inputs: Callable[[int, int], PrefillInputs],
                prefix_prefill: Optional[Callable[[PrefillInputs, int], None]] = None) -> None:
        """Capture every bucket: decode(S, K), prefill(static inputs of N prompts x T rows) and,
        when given, prefix_prefill(static inputs after a reused prefix, key window W)."""
        start = time.perf_counter()
        self._pool = torch.cuda.graph_pool_handle()
        try:
            for size in sorted(self.buckets.batch, reverse=True):
                for kv_len in sorted(self.buckets.kv, reverse=True):
                    self._decode[size, kv_len] = self._capture(lambda: decode(size, kv_len))
            shapes = [(1, t, 0) for t in self.buckets.prefill_tokens]
            shapes += [s for s in self.buckets.batch_prefill_shapes if prefix_prefill is not None or not s[2]]
            if prefix_prefill is not None:
                shapes += [(1, t, w) for t, w in self.buckets.prefix_prefill_shapes]
            for num_prompts, num_tokens, window in sorted(shapes, key=lambda s: (s[0] * s[1], s), reverse=True):
                inputs = make_inputs(num_prompts, num_tokens)
                if window:
                    graph = self._capture(lambda: prefix_prefill(inputs, window))
                else:
                    graph = self._capture(lambda: prefill(inputs))
                self._prefill[num_prompts, num_tokens, window] = (graph, inputs)
        except Exception as exc:  # incl. Triton compile errors (not RuntimeErrors)
            self.destroy()
            raise GraphCaptureError(f"CUDA graph capture failed ({exc}). {REMEDIES}") from exc
        log.info("captured %d decode graphs (batch %s x kv %s) and %d prefill graphs in %.1f s",
                 len(self._decode), list(self.buckets.batch), list(self.buckets.kv), len(self._prefill),
                 time.perf_counter() - start)

    def _capture(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        fn()  # warm-up: compiles the fused kernels for this shape, sets up cuBLAS workspaces
        torch.cuda.synchronize()
        return capture_graph(fn, self._pool)

    def can_replay_decode(self, num_slots: int, kv_len: int) -> bool:
        return (num_slots, kv_len) in self._decode

    def replay_decode(self, num_slots: int, kv_len: int) -> None:
        self._decode[num_slots, kv_len].replay()

    def can_replay_prefill(self, inputs: PrefillInputs, window: int = 0) -> bool:
        return (*inputs.shape, window) in self._prefill

    def replay_prefill(self, inputs: PrefillInputs, window: int = 0) -> None:
        graph, static = self._prefill[(*inputs.shape, window)]
        static.copy_from(inputs)
        graph.replay()

    def destroy(self) -> None:
        # NOTE: graphs go before their pool; the pool's memory returns to the caching allocator
        # only once no graph refers to it.
        self._decode.clear()
        self._prefill.clear()
        self._pool = None
        torch.cuda.empty_cache()
