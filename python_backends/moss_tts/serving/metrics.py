"""The custom metrics of a Python stub, and their one safe way out at unload.

Every family and metric is made through a `MetricHolder`, and `release_metrics()`, the last step of
every finalize(), lets go of all of them while the stub can still tell Triton. The holders: gauge
families refreshed on a thread of their own (`Gauges`), in-process histograms published as three
gauge series (`HistogramGauges`), the per-request series of `moss_tts` (`RequestMetrics`) and
counters that follow totals kept elsewhere (`Counters`); the heartbeat is one too
(triton_io.Heartbeat). Importable only inside Triton's Python backend stub.

Every set, increment or observe is an IPC round trip made holding the GIL, which the engine thread
needs back at each of its device calls: on the dev box's tiny server the gauge threads held it
4-6x as long as all 64 streams' threads together (~320 gauge calls a second: issue 34, round 15).
So a series whose value did not change since its last publication is not sent again, and the
per-request counters move once per flush by their sums."""

from __future__ import annotations

import collections
import gc
import logging
import threading
import weakref
from typing import Callable, Optional

import triton_python_backend_utils as pb_utils

log = logging.getLogger(__name__)


class MetricHolder:
    """Base of everything in a stub that holds custom metrics (pb_utils.MetricFamily / Metric).

    In tritonserver 2.51 (python_backend r24.10) a family or metric still alive when the stub tears
    itself down after finalize() kills the stub with SIGSEGV at every unload: ~Stub releases the
    model object, the metric's destructor asks Stub::GetOrCreateInstance() for the shared-memory
    pool, that unique_ptr is already reset, so it makes an empty Stub and reads its null pool
    ("segfault at 60"; fixed upstream by python_backend PRs #429/#433; perf/unload_repro/ shows it
    and this cure outside the project). So every holder registers here, and release_metrics(), the
    last step of each finalize(), stops each holder's thread and drops its metrics while the stub
    can still tell Triton."""

    def __init__(self) -> None:
        self.released = False
        with _registry_lock:
            _holders.append(self)

    def _family(self, name: str, description: str, kind) -> "pb_utils.MetricFamily":
        return _tracked(name, pb_utils.MetricFamily(name, description, kind))

    def _metric(self, family, name: str, **kwargs) -> "pb_utils.Metric":
        return _tracked(name, family.Metric(**kwargs))

    def stop(self) -> None:
        """Stop the thread that updates the metrics, if any (before they are dropped)."""

    def drop(self) -> None:
        """Let go of every family and metric: metrics first (a family must outlive its metrics)."""
        raise NotImplementedError


_registry_lock = threading.Lock()
_UNSET = object()  # a series not published yet: unequal to any value


def _send_changed(metrics, values, last: list) -> None:
    """metric.set(value) for each value unlike the one `last` holds for it (the module docstring:
    an unchanged series costs no IPC); `last` is updated as each set succeeds."""
    for i, (metric, value) in enumerate(zip(metrics, values)):
        if last[i] is _UNSET or last[i] != value:
            metric.set(value)
            last[i] = value


_holders: list[MetricHolder] = []


# Every family and metric made, held here until release_metrics() lets go of them: when the stub
# ends without finalize() (tritonserver killed; r24.10's "Non-graceful termination"), ~Stub drops
# the model object and a metric it freed would crash the stub, but these references outlive it.
_made: list[tuple[str, object]] = []


def _tracked(name: str, obj):
    with _registry_lock:
        _made.append((name, obj))
    return obj


def release_metrics() -> list[str]:
    """The last step of every finalize(): stop every MetricHolder's thread, then drop every custom
    metric of this stub while it can still tell Triton. Returns (and logs as an error) the names of
    those still referenced from elsewhere: each one crashes the stub at unload."""
    with _registry_lock:
        holders, _holders[:] = list(_holders), []
    for holder in holders:
        holder.stop()
    for holder in holders:
        holder.released = True
        holder.drop()
    with _registry_lock:
        refs = [(name, weakref.ref(obj)) for name, obj in _made]
        _made.clear()
    gc.collect()
    alive = [name for name, ref in refs if ref() is not None]
    if alive:
        log.error("custom metrics still referenced after finalize; this stub will crash at unload: %s", alive)
    return alive


def instance_label(instance: Optional[str]) -> dict[str, str]:
    """{"model_instance": name} for a model's gauges. Each instance (one stub per GPU in a
    multi-GPU layout) keeps its own values, and two stubs setting one unlabelled gauge would
    overwrite each other; `sum without (model_instance)` adds them up. Not `instance`: Prometheus
    sets that label to the scrape target and would rename ours `exported_instance`."""
    return {"model_instance": instance} if instance else {}


class Gauges(MetricHolder):
    """A gauge family `name{<label>=...}` refreshed from `read() -> {value of the label: value}`
    every `interval_s` on a thread of its own: each set is an IPC round trip, kept off the hot path."""

    def __init__(self, name: str, description: str, stats: tuple[str, ...], read: Callable[[], dict],
                 interval_s: float = 0.25, label: str = "stat", after: Callable[[], None] = lambda: None,
                 instance: Optional[str] = None) -> None:
        super().__init__()
        # The family must outlive its metrics, so both are kept here.
        self.family = self._family(name, description, pb_utils.MetricFamily.GAUGE)
        self.family_name = name
        self.metrics = {stat: self._metric(self.family, f"{name}{{{label}={stat}}}", labels={label: stat, **instance_label(instance)})
                        for stat in stats}
        self.read = read
        self.after = after  # more metric IPC that must leave from this one thread (RequestMetrics.flush)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name=f"{name}-gauges", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        failures, last = 0, [_UNSET] * len(self.metrics)
        while not self._stop.wait(self.interval_s):
            try:
                values = self.read()
                _send_changed(self.metrics.values(), [values[stat] for stat in self.metrics], last)
                self.after()
            except Exception:  # a gauge thread that dies would freeze the gauges at stale values
                failures += 1
                if failures == 1 or failures % 1000 == 0:
                    log.exception("refreshing the %s gauges failed (%d times)", self.family_name, failures)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval_s)

    def drop(self) -> None:
        self.metrics, self.family = {}, None


class HistogramGauges(MetricHolder):
    """A histogram kept in process (contract/metrics.Histogram) published as Prometheus' three series,
    `<name>_bucket{le=...}`, `<name>_sum`, `<name>_count` (gauge families: the 24.10 API can only
    observe one value per IPC call, too costly per engine step). histogram_quantile() reads them
    as any histogram. `set` runs on the gauge thread."""

    def __init__(self, name: str, description: str, bounds: tuple, instance: Optional[str] = None) -> None:
        super().__init__()
        self.families = [self._family(f"{name}_{part}", f"{description} ({part})", pb_utils.MetricFamily.GAUGE)
                         for part in ("bucket", "sum", "count")]
        buckets, total, num = self.families
        own = instance_label(instance)
        self.buckets = [self._metric(buckets, f"{name}_bucket{{le={le}}}", labels={"le": le, **own})
                        for le in [f"{b:g}" for b in bounds] + ["+Inf"]]
        self.total = self._metric(total, f"{name}_sum", labels=own)
        self.num = self._metric(num, f"{name}_count", labels=own)
        self._last = [_UNSET] * (len(self.buckets) + 2)  # what each series was last set to

    def set(self, cumulative: tuple) -> None:
        if self.released:  # a caller's closure may outlive the release (Gauges(after=...))
            return
        counts, total, num = cumulative
        _send_changed((*self.buckets, self.total, self.num), (*counts, total, num), self._last)

    def drop(self) -> None:
        self.buckets, self.total, self.num, self.families = [], None, None, []


class RequestMetrics(MetricHolder):
    """The per-request series of `moss_tts` (README, Metrics): requests by outcome, time to first
    audio and real-time factor histograms, audio seconds out.

    Stream threads only queue their records (`count`, `observe`); `flush` makes the IPC calls and
    runs on the gauge thread (Gauges(after=...)). Metric IPC from many threads at once crashed the
    24.10 parent (SIGSEGV in libtriton_python, then a boost lock_exception) when eight streams
    ended together, so every metric update of this model leaves from one thread."""

    def __init__(self) -> None:
        from ..pipeline.request_record import OUTCOMES, RTF_BUCKETS, TTFA_BUCKETS

        super().__init__()
        # Families must outlive their metrics, so both are kept here.
        self.families = [
            self._family("moss_tts_requests_total", "moss_tts requests by how they ended", pb_utils.MetricFamily.COUNTER),
            self._family("moss_tts_time_to_first_audio_seconds",
                         "request start to its first audio (or codes) response", pb_utils.MetricFamily.HISTOGRAM),
            self._family("moss_tts_rtf", "wall time per second of audio, per finished request",
                         pb_utils.MetricFamily.HISTOGRAM),
            self._family("moss_tts_audio_seconds_total", "audio sent, in seconds (12.5 frames per second)",
                         pb_utils.MetricFamily.COUNTER),
        ]
        requests, ttfa, rtf, audio = self.families
        self.requests = {outcome: self._metric(requests, f"moss_tts_requests_total{{outcome={outcome}}}",
                                               labels={"outcome": outcome}) for outcome in OUTCOMES}
        self.ttfa = self._metric(ttfa, "moss_tts_time_to_first_audio_seconds", labels={}, buckets=list(TTFA_BUCKETS))
        self.rtf = self._metric(rtf, "moss_tts_rtf", labels={}, buckets=list(RTF_BUCKETS))
        self.audio = self._metric(audio, "moss_tts_audio_seconds_total", labels={})
        self._pending: list = []
        self._lock = threading.Lock()

    def count(self, outcome: str) -> None:
        """A request refused before any stream ran (invalid input, busy)."""
        with self._lock:
            self._pending.append(outcome)

    def observe(self, record) -> None:
        with self._lock:
            self._pending.append(record)

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if self.released:
            return
        # The counters move once per flush by their sums; the histograms take one value per call.
        outcomes, audio_s = collections.Counter(), 0.0
        for item in pending:
            if isinstance(item, str):
                outcomes[item] += 1
                continue
            outcomes[item.outcome] += 1
            if item.first_output_s is not None:
                self.ttfa.observe(item.first_output_s)
            if item.outcome == "ok" and item.rtf is not None:
                self.rtf.observe(item.rtf)
            audio_s += item.audio_s or 0.0
        for outcome, count in outcomes.items():
            self.requests[outcome].increment(count)
        if audio_s:
            self.audio.increment(audio_s)

    def drop(self) -> None:
        self.requests, self.ttfa, self.rtf, self.audio, self.families = {}, None, None, None, []


class Counters(MetricHolder):
    """A counter family `name{<label>=...}` that follows running totals kept elsewhere: publish()
    adds what each total gained since the last call (a counter only goes up)."""

    def __init__(self, name: str, description: str, names: tuple[str, ...], label: str) -> None:
        super().__init__()
        self.family = self._family(name, description, pb_utils.MetricFamily.COUNTER)
        self.counters = {n: self._metric(self.family, f"{name}{{{label}={n}}}", labels={label: n}) for n in names}
        self.published = dict.fromkeys(names, 0)

    def publish(self, totals: dict) -> None:
        for n, metric in self.counters.items():
            if totals[n] != self.published[n]:  # no IPC for a counter that did not move
                metric.increment(totals[n] - self.published[n])
                self.published[n] = totals[n]

    def drop(self) -> None:
        self.counters, self.family = {}, None
