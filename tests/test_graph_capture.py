"""kernels/graph_capture.py: no cyclic collection starts while a CUDA graph is being captured (a
graph freed by one invalidates the capture: round 17's H200 GPU test failure), and the collector
comes back as it was once the last capture, in any thread, has ended. CPU only: torch's graph
classes are replaced by stand-ins that record the collector's state at capture."""

import gc
import threading

import pytest
import torch

from moss_tts.kernels import graph_capture
from moss_tts.kernels.graph_capture import capture_graph, collector_held_off


class _Graph:
    pass


class _Capturing:
    def __init__(self, graph, pool=None, stream=None):
        self.graph, self.pool, self.stream = graph, pool, stream

    def __enter__(self):
        # torch.cuda.graph begins the capture here: the collector must already be off.
        self.graph.pool, self.graph.stream = self.pool, self.stream
        self.graph.collector_on_at_begin = gc.isenabled()

    def __exit__(self, *exc):
        return False


@pytest.fixture
def fake_cuda_graphs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _Capturing)
    assert gc.isenabled()
    yield
    assert graph_capture._capturing == 0
    gc.enable()


def test_the_collector_is_off_during_a_capture_and_back_after(fake_cuda_graphs):
    seen = []
    graph = capture_graph(lambda: seen.append(gc.isenabled()), pool="pool", stream="stream")
    assert seen == [False]
    assert gc.isenabled()
    assert (graph.pool, graph.stream) == ("pool", "stream")
    assert graph.collector_on_at_begin is False


def test_a_failed_capture_turns_the_collector_back_on(fake_cuda_graphs):
    def fail():
        raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        capture_graph(fail, pool=None)
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(fake_cuda_graphs):
    gc.disable()
    capture_graph(lambda: None, pool=None)
    assert not gc.isenabled()


def test_a_dead_cycle_is_not_collected_mid_capture():
    """The failure itself: a cycle holding something whose free must not run during a capture
    (a CUDA graph) dies only after the capture, however much the capture allocates."""
    freed = []

    class Holder:
        def __del__(self):
            freed.append(gc.isenabled())

    def make_cycle():
        holder = Holder()
        holder.me = holder

    with collector_held_off():
        make_cycle()
        junk = [[i] for i in range(50 * gc.get_threshold()[0])]  # enough to trigger collections
        del junk
        assert freed == []
    gc.collect()
    assert freed == [True]


def test_overlapping_captures_in_two_threads_keep_the_collector_off_until_the_last_ends(fake_cuda_graphs):
    first_in, second_in, first_may_end, second_may_end = (threading.Event() for _ in range(4))
    seen = {}

    def first():
        first_in.set()
        first_may_end.wait(5)

    def second():
        second_in.set()
        second_may_end.wait(5)

    threads = [threading.Thread(target=capture_graph, args=(first, None)),
               threading.Thread(target=capture_graph, args=(second, None))]
    threads[0].start()
    assert first_in.wait(5)
    threads[1].start()
    assert second_in.wait(5)
    first_may_end.set()
    threads[0].join(5)
    seen["after the first"] = gc.isenabled()
    second_may_end.set()
    threads[1].join(5)
    seen["after the second"] = gc.isenabled()
    assert seen == {"after the first": False, "after the second": True}
