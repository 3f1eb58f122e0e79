"""WorkerStats: the in-process vocoder's counters and gauges (VocoderWorker.stats()), which the
`moss_tts` adapter publishes as `moss_tts_vocoder`. No Triton import."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerStats:
    rounds: int
    jobs: int
    frames: int
    round_ms: int  # wall time inside rounds (GPU steps + host work)
    queued_jobs: int
    active_slots: int
    free_slots: int
    sessions_started: int
    sessions_ended: int
    sessions_failed: int
    graph_calls: int
    decode_calls: int
