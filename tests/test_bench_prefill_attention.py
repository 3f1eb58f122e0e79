"""perf/bench_prefill_attention.py's launches and its copy of the old path, on the CPU (its timings
need the H200): the torch path it times computes what the kernel's reference does, on each
prompt's real rows, so the bench compares like with like."""

from __future__ import annotations

import torch

from moss_tts.kernels.prefill_attention import reference_prefill_attention
import perf.bench_prefill_attention as bench
from moss_tts.kernels.fused import Fusions
from perf.bench_prefill_attention import HEAD_DIM, KV_HEADS, SHAPES, SLOTS, launch, torch_call, window_of


def test_launches_fit_their_shape():
    gen = torch.Generator().manual_seed(0)
    for name, (n, t, (lo, hi), (new_lo, new_hi)) in SHAPES.items():
        q, slots, starts, lengths = launch(SHAPES[name], gen, "cpu")
        new = lengths - starts
        assert q.shape[:2] == (n, t) and len(set(slots.tolist())) == n and int(slots.max()) < SLOTS - 1, name
        assert int(new[0]) == t and bool((new >= 1).all()) and bool((new <= t).all()), name
        assert bool((starts >= lo).all()) and bool((starts < hi).all()), name
        assert window_of(int(lengths.max())) >= int(lengths.max()), name


def test_the_timed_torch_path_is_the_reference():
    gen = torch.Generator().manual_seed(1)
    q, slots, starts, lengths = launch(SHAPES["after_prefix_n64"], gen, "cpu")
    q = q.float()
    window = window_of(int(lengths.max()))
    k, v = (torch.randn(SLOTS, window, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    t = q.shape[1]
    positions = starts.unsqueeze(1) + torch.arange(t)
    allowed = torch.arange(window).view(1, 1, window) <= positions.unsqueeze(2)
    bias = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min).unsqueeze(1)
    got = torch_call(q, k, v, slots, starts, bias, window).transpose(1, 2)
    expected = reference_prefill_attention(q, k, v, slots, starts, lengths)
    for i, (s, e) in enumerate(zip(starts.tolist(), lengths.tolist())):
        torch.testing.assert_close(got[i, :e - s], expected[i, :e - s], rtol=1e-4, atol=1e-4)


def test_the_timed_torch_path_from_row0_is_prefills():
    """A launch with no reused prefix: the engine's `prefill` attends over the new rows' own keys."""
    gen = torch.Generator().manual_seed(2)
    q, slots, starts, lengths = launch((6, 20, (0, 1), (5, 20)), gen, "cpu")
    q = q.float()
    caches = [tuple(torch.randn(SLOTS, 32, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))] * bench.CACHES
    got = bench.torch_path_of(q, slots, starts, lengths, caches)(0).transpose(1, 2)
    expected = reference_prefill_attention(q, *caches[0], slots, starts, lengths)
    for i, e in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[i, :e], expected[i, :e], rtol=1e-4, atol=1e-4)


def test_time_qkv_runs_both_paths(monkeypatch):
    """Each path once on the CPU (no graphs): the kernel's torch fallback equals the compiled path's
    eager form, after a prefix and from row 0."""
    monkeypatch.setattr(bench, "graph_ms", lambda call, reps, iters: call(0) is not None and 1.0)
    gen = torch.Generator().manual_seed(3)
    caches = [tuple(torch.zeros(SLOTS, 64, KV_HEADS, HEAD_DIM) for _ in range(2)) for _ in range(bench.CACHES)]
    for starts in (torch.tensor([5, 30]), torch.tensor([0, 0])):
        q = torch.randn(2, 8, bench.HEADS, HEAD_DIM, generator=gen)
        got = bench.time_qkv(q, torch.tensor([3, 9]), starts, caches, Fusions.eager())
        assert got == {"torch_us": 1e3, "kernel_us": 1e3, "kernel_relative_error": 0.0}
