"""The stub's garbage collector (serving/gc_watch.py): what is loaded is frozen out of collections,
and every collection is counted and timed; on the real server its gauges are published."""

from __future__ import annotations

import gc

import pytest

from moss_tts.serving.gc_watch import GcWatch


def test_collections_are_counted_and_timed_and_the_watch_detaches():
    watch = GcWatch().start()
    try:
        before = watch.stats()
        garbage = [[] for _ in range(1000)]
        for a, b in zip(garbage, garbage[1:]):
            a.append(b), b.append(a)  # cycles, for a collection to find
        del garbage
        gc.collect()
        gc.collect(0)
        after = watch.stats()
        assert after.collections_gen2 >= before.collections_gen2 + 1
        assert after.collections_gen0 >= before.collections_gen0 + 1
        assert after.pause_ms_gen2 >= before.pause_ms_gen2 and after.pause_ms_max >= 0
    finally:
        watch.stop()
    assert watch._on_collection not in gc.callbacks
    gc.collect()
    assert watch.stats().collections_gen2 == after.collections_gen2  # no longer watching
    watch.stop()  # twice is harmless


def test_freezing_moves_what_is_alive_out_of_the_collections():
    kept = [{"i": i} for i in range(20000)]
    try:
        watch = GcWatch()
        frozen = watch.freeze_loaded()
        stats = watch.stats()  # the start-up collection is timed apart, not counted as a serving one
        assert stats.freeze_pause_ms >= 0 and stats.collections_gen2 == 0 and stats.frozen_objects <= frozen
        # Frozen objects still die by reference count (another thread of this process may free
        # some meanwhile): the count can only fall.
        assert frozen >= len(kept) and len(kept) <= gc.get_freeze_count() <= frozen
        assert not any(obj is kept for obj in gc.get_objects())  # a collection no longer walks it
    finally:
        gc.unfreeze()  # this test process goes on collecting as before


def test_the_gauges_never_walk_the_frozen_objects(monkeypatch):
    """stats() runs every 0.5 s on the gauge thread: gc.get_freeze_count() there walked ~706,000
    objects holding the GIL (~58 ms on the H200), a stall of the whole stub each time."""
    kept = [{"i": i} for i in range(1000)]
    try:
        watch = GcWatch()
        frozen = watch.freeze_loaded()
        assert frozen >= len(kept)

        def walk():
            raise AssertionError("stats() walked the permanent generation")
        monkeypatch.setattr(gc, "get_freeze_count", walk)
        assert watch.stats().frozen_objects == frozen
    finally:
        gc.unfreeze()  # this test process goes on collecting as before


@pytest.mark.triton
def test_the_served_model_publishes_its_collections_with_what_it_froze(triton):
    # > 0: the gauge publishes 0 until initialize() has frozen what it loaded
    values = triton.wait_for_metrics(lambda m: m.get('moss_tts_gc{stat="frozen_objects"}', 0) > 0, timeout=5)
    assert values['moss_tts_gc{stat="frozen_objects"}'] > 50_000  # torch, the tokenizer, the model
    for stat in ("collections_gen0", "collections_gen2", "pause_ms_gen2", "pause_ms_max", "freeze_pause_ms"):
        assert f'moss_tts_gc{{stat="{stat}"}}' in values
