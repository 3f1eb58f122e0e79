"""The operator's histograms kept in process: bucket bounds (README, Metrics; deploy/grafana read
them by these values) and `Histogram`, a list increment per observation that a model's gauge
thread publishes as Prometheus' _bucket/_sum/_count series. No torch, no Triton."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field, fields

# Bucket upper bounds of the engine's histograms (README, Metrics; deploy/grafana).
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
STEP_MS_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 50, 100, 200, 500, 1000)


@dataclass
class Histogram:
    """Counts per bucket (upper bounds `bounds`, then +Inf), their sum and number: a Prometheus
    histogram kept in process (a list increment per step) and published by the gauge thread."""

    bounds: tuple
    counts: list = field(default_factory=list)
    total: float = 0.0
    num: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.num += 1

    def cumulative(self) -> tuple[list[int], float, int]:
        """(count of values <= each bound, then all), sum, count: Prometheus' _bucket/_sum/_count."""
        return list(itertools.accumulate(self.counts)), self.total, self.num


def stat_names(stats_class) -> tuple[str, ...]:
    """The gauge names of a stats dataclass: its own fields, in order (a model publishes each
    snapshot's fields under these names, so a new field is a new gauge with no list to edit)."""
    return tuple(f.name for f in fields(stats_class))
