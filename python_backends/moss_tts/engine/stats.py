"""Engine counters, kept under the engine's lock and handed out as frozen snapshots."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    requests_admitted: int  # moved from the queue into a KV slot
    requests_finished: int  # final events of any reason (cancelled and failed included)
    requests_cancelled: int
    requests_failed: int
    steps: int  # decode steps run
    max_batch_size_seen: int  # most rows in one decode step
    frames_generated: int
    running: int
    waiting: int
    free_slots: int


@dataclass
class StatsCounters:
    requests_admitted: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    steps: int = 0
    max_batch_size_seen: int = 0
    frames_generated: int = 0

    def record_step(self, batch_size: int, num_frames: int) -> None:
        self.steps += 1
        self.max_batch_size_seen = max(self.max_batch_size_seen, batch_size)
        self.frames_generated += num_frames

    def record_finish(self, reason: str) -> None:
        self.requests_finished += 1
        self.requests_cancelled += reason == "cancelled"
        self.requests_failed += reason == "error"

    def snapshot(self, running: int, waiting: int, free_slots: int) -> EngineStats:
        return EngineStats(self.requests_admitted, self.requests_finished, self.requests_cancelled,
                           self.requests_failed, self.steps, self.max_batch_size_seen,
                           self.frames_generated, running, waiting, free_slots)
