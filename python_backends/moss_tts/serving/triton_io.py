"""Small helpers shared by the model_repository adapters. Importable only inside Triton's
Python backend stub (it imports triton_python_backend_utils)."""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Callable, Optional

import numpy as np
import triton_python_backend_utils as pb_utils

# Error kinds by name; the stub binds TritonError only after model.py is imported, so the
# numeric codes are looked up when an error is made, never at import time.
INVALID, UNAVAILABLE, CANCELLED, INTERNAL = "invalid", "unavailable", "cancelled", "internal"
_CODE_ATTRS = {INVALID: "INVALID_ARG", UNAVAILABLE: "UNAVAILABLE", CANCELLED: "CANCELLED", INTERNAL: "INTERNAL"}
# gRPC stream responses carry only a message, not a status code, so every error message of
# ours starts with the gRPC code name in brackets: "[INVALID_ARGUMENT] input TEXT is empty ...".
GRPC_NAMES = {INVALID: "INVALID_ARGUMENT", UNAVAILABLE: "UNAVAILABLE", CANCELLED: "CANCELLED", INTERNAL: "INTERNAL"}
_PREFIX = re.compile(r"^(in ensemble '[^']*', )?\[([A-Z_]+)\] ")
# Triton's own message for a request that reached a dead stub (24.10 never restarts it).
_DEAD_STUB = re.compile(r"Stub process( '[^']*')? is not healthy")
# Triton's own refusal of a request its bounded queue has no room for (dynamic batcher).
_QUEUE_FULL = re.compile(r"Exceeds maximum queue size")
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


def error(message: str, code: str = INVALID):
    return pb_utils.TritonError(f"[{GRPC_NAMES[code]}] {strip_prefix(message)}",
                                getattr(pb_utils.TritonError, _CODE_ATTRS[code]))


def strip_prefix(message: str) -> str:
    """Drop a child's "[CODE] " tag (and Triton's "in ensemble 'x', ") before re-tagging."""
    return _PREFIX.sub("", message, count=1)


def error_response(message: str, code=INVALID):
    return pb_utils.InferenceResponse(output_tensors=[], error=error(message, code))


def bytes_tensor(name: str, values: list[bytes | str], shape) -> "pb_utils.Tensor":
    return pb_utils.Tensor(name, np.array(values, dtype=np.object_).reshape(shape))


def error_kind(err) -> str:
    """A child's TritonError as one of our kind names, from its "[CODE]" tag or else its code;
    a dead child stub (the server needs a restart) and a child's full queue (retry later) are
    UNAVAILABLE, not the client's fault."""
    match = _PREFIX.match(err.message())
    if _DEAD_STUB.search(err.message()) or _QUEUE_FULL.search(err.message()):
        return UNAVAILABLE
    if match:
        return {v: k for k, v in GRPC_NAMES.items()}.get(match.group(2), INTERNAL)
    try:
        code = err.code()
    except Exception:  # older stubs have no code()
        return INTERNAL
    for kind, attr in _CODE_ATTRS.items():
        if code == getattr(pb_utils.TritonError, attr):
            return kind
    return INTERNAL


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


class Gauges:
    """A gauge family `name{<label>=...}` refreshed from `read() -> {value of the label: value}`
    every `interval_s` on a thread of its own: each set is an IPC round trip, kept off the hot path."""

    def __init__(self, name: str, description: str, stats: tuple[str, ...], read: Callable[[], dict],
                 interval_s: float = 0.25, label: str = "stat") -> None:
        # The family must outlive its metrics, so both are kept here.
        self.family = pb_utils.MetricFamily(name, description, pb_utils.MetricFamily.GAUGE)
        self.metrics = {stat: self.family.Metric(labels={label: stat}) for stat in stats}
        self.read = read
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name=f"{name}-gauges", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(self.interval_s):
            values = self.read()
            for stat, metric in self.metrics.items():
                metric.set(values[stat])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval_s)
