"""One way the benchmarks time GPU work without launch gaps: the calls captured once in a CUDA
graph, the graph replayed and timed by events (as the server replays its own graphs)."""

from __future__ import annotations

import statistics
from typing import Callable

import torch

from moss_tts.kernels.graph_capture import capture_graph


def graph_ms(call: Callable[[int], object], reps: int, iters: int) -> float:
    """Median over `iters` replays of a graph of call(0) .. call(reps - 1), in ms per call. call(0)
    runs once first, on the capture's stream, so compilation and lazy set-up stay outside it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(0)
        graph = capture_graph(lambda: [call(i) for i in range(reps)], None, stream)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()  # warm-up
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)
