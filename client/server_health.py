"""Is the moss-tts pipeline alive? Read from the models' own heartbeats.

Triton 24.10 keeps /v2/health/ready at 200 when a Python stub has died and never restarts it
(python_backend: "TODO: Implement restart on decoupled"). So every model instance of ours counts
`moss_heartbeat_total{model, model_instance}` up every 0.5 s while its work is not stuck (a step, a
BLS call or a send running longer than its limit stops it, and so does a process that can no
longer run Python). A counter that has not moved for `stale_after_s` means a dead or wedged
stub: not ready. The cure is a restart of tritonserver (Kubernetes does it from the probes).

`HeartbeatMonitor.poll()` is meant to be called every second or so (the OpenAI shim does);
`check()` is the one-shot form (two scrapes), used by `python -m client.healthcheck`.
"""

from __future__ import annotations

import re
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Optional

MODELS = ("moss_tts", "ref_encoder", "vocoder")  # every python model of model_repository/
FAMILY = "moss_heartbeat_total"
_SERIES = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def metrics_url_for(grpc_url: str, metrics_port: int = 8002) -> str:
    """The metrics endpoint next to a gRPC address: host:8001 -> http://host:8002/metrics."""
    host = grpc_url.rsplit(":", 1)[0] if ":" in grpc_url else grpc_url
    return f"http://{host}:{metrics_port}/metrics"


def parse_series(text: str, prefix: str = "") -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every series in Prometheus text whose name starts with `prefix`."""
    return [(name, dict(_LABEL.findall(labels)), float(value)) for name, labels, value in _SERIES.findall(text)
            if name.startswith(prefix)]


def parse_heartbeats(text: str) -> dict[tuple[str, str], float]:
    """{(model, instance): count} from Prometheus text."""
    return {(labels.get("model", "?"), labels.get("model_instance", "?")): value
            for name, labels, value in parse_series(text, FAMILY) if name == FAMILY}


def fetch(metrics_url: str, timeout_s: float = 2.0) -> str:
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        return response.read().decode("utf-8", "replace")


@dataclass
class HeartbeatMonitor:
    metrics_url: str
    stale_after_s: float = 3.0
    models: tuple[str, ...] = MODELS
    clock: Callable[[], float] = time.monotonic
    _seen: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # -> (count, moved at)

    def poll(self, text: Optional[str] = None) -> Optional[str]:
        """Scrape (or take `text`) and judge: None when every instance's heart beats, else why not."""
        try:
            beats = parse_heartbeats(fetch(self.metrics_url) if text is None else text)
        except OSError as exc:
            return f"tritonserver metrics at {self.metrics_url} are unreachable ({type(exc).__name__})"
        now = self.clock()
        for key, count in beats.items():
            last = self._seen.get(key)
            if last is None or count != last[0]:
                self._seen[key] = (count, now)
        problems = [f"model {model!r} reports no heartbeat (not loaded?)" for model in self.models
                    if not any(m == model for m, _ in beats)]
        for (model, instance), (_, moved) in sorted(self._seen.items()):
            if now - moved > self.stale_after_s:
                problems.append(f"{instance} ({model}) has had no heartbeat for {now - moved:.0f} s: its stub is "
                                "dead or stuck; restart tritonserver")
        return "; ".join(problems) or None


def check(metrics_url: str, window_s: float = 1.6) -> Optional[str]:
    """One-shot: two scrapes `window_s` apart (three beats); every counter must have moved."""
    monitor = HeartbeatMonitor(metrics_url, stale_after_s=window_s / 2)
    problem = monitor.poll()
    if problem is not None:
        return problem
    time.sleep(window_s)
    return monitor.poll()
