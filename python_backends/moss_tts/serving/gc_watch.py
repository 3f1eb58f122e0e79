"""Python's cyclic garbage collector in a stub: what a model holds once loaded is frozen out of
its collections, and every collection is timed for the operator's gauges.

Why: a full (generation 2) collection walks every tracked object of the process, holding the
GIL, so while it runs the engine thread, the vocoder worker and every stream thread stand still.
A stub that has loaded the stack holds ~300,000 tracked objects (torch, the tokenizer, the model's
modules) before it serves anything: on the 2-core dev machine one full collection of the tiny
checkpoint's stub took 185 ms. On the H200 (issue 31, first-audio trace of 128 WebSocket text
sessions) the engine's first codes and the vocoder's rounds stopped for ~0.5 s at the same moment,
the engine's host time 779 ms over 27 steps: a pause of the whole process. Whether collections
caused that one was not measured (these gauges say it next time).

`GcWatch.freeze_loaded()`, at the end of `initialize`: one collection (timed: what a full one
of the loaded stub costs), then `gc.freeze()` moves every object alive to the permanent
generation, which no collection scans; a full collection then walks only what requests created
since. The frozen count is taken once, there: `gc.get_freeze_count()` walks the whole permanent
generation holding the GIL (~58 ms for the real stub's ~706,000 objects on the H200), and the
gauge thread called it every 0.5 s, which stopped the whole stub ~12% of the time (a py-spy
record of the GIL holder under the 256-stream soak, issue 34).
`GcWatch.start()`, after that: every later collection is timed (gc.callbacks: the callback runs
in whichever thread triggered it, with the GIL, so it only adds to counters), so the serving
counts and pauses never include the start-up collection.
No Triton import.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class GcStats:
    collections_gen0: int
    collections_gen1: int
    collections_gen2: int
    pause_ms_gen2: int  # all full collections together
    pause_ms_max: int  # the longest collection of any generation
    frozen_objects: int  # objects moved to the permanent generation by freeze_loaded (counted then)
    freeze_pause_ms: int  # the start-up collection before the freeze (in none of the above)


class GcWatch:
    def __init__(self) -> None:
        self._collections = [0, 0, 0]
        self._pause_s_gen2 = 0.0
        self._pause_s_max = 0.0
        self._freeze_pause_s = 0.0
        self._frozen = 0
        self._started = 0.0
        self._is_watching = False

    def freeze_loaded(self) -> int:
        """Collect once (timed), then freeze everything alive out of later collections; returns how many."""
        started = time.perf_counter()
        gc.collect()
        self._freeze_pause_s = time.perf_counter() - started
        gc.freeze()
        self._frozen = gc.get_freeze_count()  # once: each call walks every frozen object
        return self._frozen

    def start(self) -> "GcWatch":
        if not self._is_watching:
            gc.callbacks.append(self._on_collection)
            self._is_watching = True
        return self

    def stop(self) -> None:
        if self._is_watching:
            gc.callbacks.remove(self._on_collection)
            self._is_watching = False

    def _on_collection(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        pause = now - self._started
        generation = info.get("generation", 2)
        self._collections[generation] += 1
        if generation == 2:
            self._pause_s_gen2 += pause
        self._pause_s_max = max(self._pause_s_max, pause)

    def stats(self) -> GcStats:
        c = self._collections
        return GcStats(c[0], c[1], c[2], round(self._pause_s_gen2 * 1000), round(self._pause_s_max * 1000),
                       self._frozen, round(self._freeze_pause_s * 1000))
