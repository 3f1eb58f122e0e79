"""Small helpers shared by the model_repository adapters: the model's config and parameters, a
request's inputs, error responses, the stub's set-up and its heartbeat (the other metrics:
metrics.py). Importable only inside Triton's Python backend stub (it imports
triton_python_backend_utils)."""

from __future__ import annotations

import faulthandler
import json
import logging
import threading
from typing import Callable, Optional

import numpy as np
import triton_python_backend_utils as pb_utils

from ..contract.errors import ErrorKind
from .metrics import MetricHolder
from .stub_guard import exit_with_server, guard_stub

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
    # One inputs() call per request: pb_utils.get_input_tensor_by_name makes the list of every
    # input (a pybind wrapper each) again for each name asked, and parsing asks ~30 names, on
    # the stub's main thread, with the GIL, while a burst of requests waits behind it.
    tensors = {tensor.name(): tensor for tensor in request.inputs()}

    def get(name: str) -> Optional[np.ndarray]:
        tensor = tensors.get(name)
        return None if tensor is None else tensor.as_numpy()
    get.names = tuple(tensors)  # the inputs the request carries (a STOP carries no other)
    return get


def error(message: str, kind: ErrorKind = ErrorKind.INVALID_ARGUMENT):
    """A TritonError whose message starts with the kind's "[CODE]" tag (contract.ErrorKind.tag)."""
    return pb_utils.TritonError(kind.tag(message), getattr(pb_utils.TritonError, _CODE_ATTRS[kind]))


def error_response(message: str, kind: ErrorKind = ErrorKind.INVALID_ARGUMENT):
    return pb_utils.InferenceResponse(output_tensors=[], error=error(message, kind))


def bytes_tensor(name: str, values: list[bytes | str], shape) -> "pb_utils.Tensor":
    return pb_utils.Tensor(name, np.array(values, dtype=np.object_).reshape(shape))


def prepare_stub() -> None:
    """Once per stub: its guard and its exit with the server (stub_guard.py: no stub outlives
    tritonserver, and none crashes when it is killed), and Python's faulthandler, so that a
    crash of the stub (SIGSEGV, SIGABRT...) writes "Fatal Python error" and every thread's Python
    stack into the server log instead of vanishing into the kernel log (the tests read it)."""
    faulthandler.enable()
    guard_stub()
    exit_with_server()


class Heartbeat(MetricHolder):
    """`moss_heartbeat_total{model, model_instance}` counts up every 0.5 s while the oldest unit of
    work (`oldest_work()`) has run less than `stall_limit_s`. It stops when the stub dies, when its work is stuck (a send or
    step that never returns) and when the process can no longer run Python (a GIL deadlock):
    client/server_health.py reads a counter that stops as "not ready"."""

    INTERVAL_S = 0.5

    def __init__(self, args: dict, oldest_work: Callable[[], tuple[float, str]] = lambda: (0.0, ""),
                 stall_limit_s: float = 30.0) -> None:
        super().__init__()
        # (seconds, name) of the oldest unit of work running (StallWatch.oldest, stall_watch.oldest_of):
        # the name goes into the log (a response send, a BLS call to ..., an engine step), so a
        # wedge seen once in a long soak says where it waited.
        self.oldest_work = oldest_work
        self.stall_limit_s = stall_limit_s
        # The family must outlive its metric, so both are kept here.
        self.family = self._family(HEARTBEAT_FAMILY, "moss-tts model liveness: +1 every 0.5 s while not stalled",
                                   pb_utils.MetricFamily.COUNTER)
        self.metric = self._metric(self.family, HEARTBEAT_FAMILY, labels={"model": args["model_name"],
                                                                          "model_instance": args["model_instance_name"]})
        self._stop = threading.Event()
        self._was_stalled = False
        self._thread = threading.Thread(target=self._beat, name="moss-heartbeat", daemon=True)
        self._thread.start()
        prepare_stub()

    def _beat(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            stalled, what = self.oldest_work()
            is_stalled = stalled >= self.stall_limit_s
            if is_stalled != self._was_stalled:
                if is_stalled:
                    log.error("work stalled (%.0f s: %s); heartbeat stopped", stalled, what)
                else:
                    log.warning("work moves again (%.0f s); heartbeat resumed", stalled)
                self._was_stalled = is_stalled
            if not is_stalled:
                self.metric.increment(1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.INTERVAL_S)

    def drop(self) -> None:
        self.metric = self.family = None


PROBE_MODEL = "moss_tts_shutdown_probe"  # no such model: the answer costs no model any work


def ask_missing_model() -> str:
    """One BLS call to a model that does not exist; Triton's answer (stop_watch.ServerStopWatch)."""
    try:
        response = pb_utils.InferenceRequest(model_name=PROBE_MODEL, inputs=[], requested_output_names=[]).exec()
        return response.error().message() if response.has_error() else ""
    except Exception as exc:
        return str(exc)

