"""Small helpers shared by the model_repository adapters. Importable only inside Triton's
Python backend stub (it imports triton_python_backend_utils)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Callable, Optional

import numpy as np
import triton_python_backend_utils as pb_utils

from ..contract import ErrorKind

# TritonError's code for each kind; the stub binds TritonError only after model.py is imported,
# so the codes are looked up when an error is made, never at import time.
_CODE_ATTRS = {ErrorKind.INVALID_ARGUMENT: "INVALID_ARG", ErrorKind.UNAVAILABLE: "UNAVAILABLE",
               ErrorKind.CANCELLED: "CANCELLED", ErrorKind.INTERNAL: "INTERNAL"}
HEARTBEAT_FAMILY = "moss_heartbeat_total"  # client/server_health.py reads it by this name
log = logging.getLogger(__name__)


def model_parameters(args: dict) -> dict[str, str]:
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def model_config(args: dict) -> dict:
    return json.loads(args["model_config"])


def require_decoupled(config: dict) -> None:
    """Load-time contract check: the model streams, so its pbtxt must say decoupled."""
    if not pb_utils.using_decoupled_model_transaction_policy(config):
        raise pb_utils.TritonModelException(
            f"{config['name']} must be decoupled: set model_transaction_policy {{ decoupled: true }}")


def getter(request) -> Callable[[str], Optional[np.ndarray]]:
    def get(name: str) -> Optional[np.ndarray]:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()
    return get


def error(message: str, kind: ErrorKind = ErrorKind.INVALID_ARGUMENT):
    """A TritonError whose message starts with the kind's "[CODE]" tag (contract.ErrorKind.tag)."""
    return pb_utils.TritonError(kind.tag(message), getattr(pb_utils.TritonError, _CODE_ATTRS[kind]))


def error_response(message: str, kind: ErrorKind = ErrorKind.INVALID_ARGUMENT):
    return pb_utils.InferenceResponse(output_tensors=[], error=error(message, kind))


def bytes_tensor(name: str, values: list[bytes | str], shape) -> "pb_utils.Tensor":
    return pb_utils.Tensor(name, np.array(values, dtype=np.object_).reshape(shape))


class Heartbeat:
    """`moss_heartbeat_total{model, instance}` counts up every 0.5 s while `stalled_seconds()`
    stays under `stall_limit_s`. It stops when the stub dies, when its work is stuck (a send or
    step that never returns) and when the process can no longer run Python (a GIL deadlock):
    client/server_health.py reads a counter that stops as "not ready"."""

    INTERVAL_S = 0.5

    def __init__(self, args: dict, stalled_seconds: Callable[[], float] = lambda: 0.0,
                 stall_limit_s: float = 30.0) -> None:
        self.stalled_seconds = stalled_seconds
        self.stall_limit_s = stall_limit_s
        # The family must outlive its metric, so both are kept here.
        self.family = pb_utils.MetricFamily(HEARTBEAT_FAMILY, "moss-tts model liveness: +1 every 0.5 s while not stalled",
                                            pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels={"model": args["model_name"], "instance": args["model_instance_name"]})
        self._stop = threading.Event()
        self._was_stalled = False
        self._thread = threading.Thread(target=self._beat, name="moss-heartbeat", daemon=True)
        self._thread.start()
        exit_when_orphaned()

    def _beat(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            stalled = self.stalled_seconds()
            is_stalled = stalled >= self.stall_limit_s
            if is_stalled != self._was_stalled:
                (log.error if is_stalled else log.warning)(
                    "work %s (%.0f s); heartbeat %s", "stalled" if is_stalled else "moves again", stalled,
                    "stopped" if is_stalled else "resumed")
                self._was_stalled = is_stalled
            if not is_stalled:
                self.metric.increment(1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.INTERVAL_S)


def exit_when_orphaned(interval_s: float = 1.0) -> None:
    """Start (once per process) a thread that ends this stub when tritonserver is gone.

    A 24.10 stub is meant to notice a dead parent and exit, but it does that through a mutex that
    a thread blocked in a metrics IPC call can hold forever; after Triton's "Exit timeout expired"
    such stubs lived on as orphans (seen in CI). This thread never touches IPC: when the parent
    pid changes it exits the process at once.
    """
    global _orphan_watch
    if _orphan_watch is not None:
        return
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                log.error("tritonserver (pid %d) is gone: this stub exits", parent)
                os._exit(1)

    _orphan_watch = threading.Thread(target=watch, name="moss-orphan-watch", daemon=True)
    _orphan_watch.start()


_orphan_watch: Optional[threading.Thread] = None


class Gauges:
    """A gauge family `name{<label>=...}` refreshed from `read() -> {value of the label: value}`
    every `interval_s` on a thread of its own: each set is an IPC round trip, kept off the hot path."""

    def __init__(self, name: str, description: str, stats: tuple[str, ...], read: Callable[[], dict],
                 interval_s: float = 0.25, label: str = "stat") -> None:
        # The family must outlive its metrics, so both are kept here.
        self.family = pb_utils.MetricFamily(name, description, pb_utils.MetricFamily.GAUGE)
        self.family_name = name
        self.metrics = {stat: self.family.Metric(labels={label: stat}) for stat in stats}
        self.read = read
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name=f"{name}-gauges", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval_s):
            try:
                values = self.read()
                for stat, metric in self.metrics.items():
                    metric.set(values[stat])
            except Exception:  # a gauge thread that dies would freeze the gauges at stale values
                failures += 1
                if failures == 1 or failures % 1000 == 0:
                    log.exception("refreshing the %s gauges failed (%d times)", self.family_name, failures)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval_s)
