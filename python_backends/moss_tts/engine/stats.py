"""Engine counters, kept under the engine's lock and handed out as frozen snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Optional

from ..contract.metrics import BATCH_SIZE_BUCKETS, STEP_MS_BUCKETS, Histogram
from .prefix_cache import PrefixStats

if TYPE_CHECKING:
    from .first_audio_gate import FirstAudioHold


@dataclass(frozen=True)
class EngineStats:
    requests_admitted: int  # moved from the queue into a KV slot
    requests_finished: int  # final events of any reason (cancelled and failed included)
    requests_cancelled: int
    requests_failed: int
    steps: int  # steps launched (prefills and/or one decode each)
    max_batch_size_seen: int  # most requests served by one step (prefilled or decoded)
    frames_generated: int
    running: int
    waiting: int
    free_slots: int
    # CUDA graph use (GPU, graphs on): a hit replays a graph, a fallback runs eagerly because the
    # shape has none. Both stay 0 on the CPU and with enforce_eager.
    decode_graph_hits: int = 0
    decode_graph_fallbacks: int = 0
    prefill_graph_hits: int = 0
    prefill_graph_fallbacks: int = 0
    # Prefix reuse (0 when off): prompt rows admitted, how many of them were copied from the
    # pool instead of prefilled, pool blocks written and evicted, pool blocks holding a prefix.
    prefix_prompt_rows: int = 0
    prefix_reused_rows: int = 0
    prefix_blocks_stored: int = 0
    prefix_blocks_evicted: int = 0
    prefix_pool_blocks_used: int = 0
    # Engine thread time (ms, cumulative): host work of the steps (scheduling, launching,
    # applying frames, emitting chunks) and time blocked waiting for the device's output. A
    # busy engine with a small wait share is host-bound.
    step_host_ms: int = 0
    step_wait_ms: int = 0
    # Two parts of step_host_ms (the rest is scheduling and staging admitted prompts): launching
    # the step (the runner's uploads, prefills, graph replay) and applying the previous step's
    # frames (stops, chunks, events). Which part grows while a burst of requests is admitted
    # tells the engine's own work from waiting for the GIL at its torch calls (issue 34).
    step_launch_ms: int = 0
    step_apply_ms: int = 0
    # The first-audio hold (EngineConfig.first_audio_hold_rows): steps that waited for a new
    # stream's first vocoder round, how many of those waits ran out, and the host time they took
    # (part of step_host_ms).
    first_audio_holds: int = 0
    first_audio_hold_timeouts: int = 0
    first_audio_hold_ms: int = 0


@dataclass
class GraphUse:
    """Graph hits and fallbacks of one step, filled in by the runner."""

    decode_hits: int = 0
    decode_fallbacks: int = 0
    prefill_hits: int = 0
    prefill_fallbacks: int = 0

    def count_decode(self, is_graphed: bool, graphs_on: bool) -> None:
        self.decode_hits += is_graphed
        self.decode_fallbacks += graphs_on and not is_graphed

    def count_prefill(self, is_graphed: bool, graphs_on: bool) -> None:
        self.prefill_hits += is_graphed
        self.prefill_fallbacks += graphs_on and not is_graphed

    def add(self, other: "GraphUse") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def stats(self) -> dict[str, int]:
        """The counters as EngineStats names them (decode_hits -> decode_graph_hits, ...)."""
        return {f.name.replace("_", "_graph_", 1): getattr(self, f.name) for f in fields(self)}


@dataclass
class StatsCounters:
    requests_admitted: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    steps: int = 0
    max_batch_size_seen: int = 0
    frames_generated: int = 0
    graphs: GraphUse = field(default_factory=GraphUse)
    host_s: float = 0.0
    wait_s: float = 0.0
    launch_s: float = 0.0
    apply_s: float = 0.0
    hold: Optional[FirstAudioHold] = None  # counts its own holds (engine thread), read at snapshot
    batch_sizes: Histogram = field(default_factory=lambda: Histogram(BATCH_SIZE_BUCKETS))
    step_ms: Histogram = field(default_factory=lambda: Histogram(STEP_MS_BUCKETS))

    def record_time(self, host_s: float, wait_s: float, launch_s: float = 0.0, apply_s: float = 0.0) -> None:
        self.host_s += host_s
        self.wait_s += wait_s
        self.launch_s += launch_s
        self.apply_s += apply_s
        self.step_ms.observe((host_s + wait_s) * 1000)  # one engine loop: host work + wait for the device

    def record_step(self, batch_size: int, use: GraphUse) -> None:
        self.steps += 1
        self.max_batch_size_seen = max(self.max_batch_size_seen, batch_size)
        self.batch_sizes.observe(batch_size)
        self.graphs.add(use)

    def record_frames(self, num_frames: int) -> None:
        self.frames_generated += num_frames

    def record_finish(self, reason: str) -> None:
        self.requests_finished += 1
        self.requests_cancelled += reason == "cancelled"
        self.requests_failed += reason == "error"

    def snapshot(self, running: int, waiting: int, free_slots: int,
                 prefix: Optional[PrefixStats] = None) -> EngineStats:
        p, h = prefix or PrefixStats(0, 0, 0, 0, 0, 0, 0), self.hold
        return EngineStats(self.requests_admitted, self.requests_finished, self.requests_cancelled,
                           self.requests_failed, self.steps, self.max_batch_size_seen,
                           self.frames_generated, running, waiting, free_slots, **self.graphs.stats(),
                           prefix_prompt_rows=p.prompt_rows, prefix_reused_rows=p.reused_rows,
                           prefix_blocks_stored=p.blocks_stored, prefix_blocks_evicted=p.blocks_evicted,
                           prefix_pool_blocks_used=p.pool_blocks_used, step_host_ms=round(self.host_s * 1000),
                           step_wait_ms=round(self.wait_s * 1000), step_launch_ms=round(self.launch_s * 1000),
                           step_apply_ms=round(self.apply_s * 1000),
                           first_audio_holds=h.holds if h else 0,
                           first_audio_hold_timeouts=h.timeouts if h else 0,
                           first_audio_hold_ms=round(h.seconds * 1000) if h else 0)
