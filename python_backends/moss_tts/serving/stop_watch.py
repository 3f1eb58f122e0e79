"""ServerStopWatch: tells a stub once that tritonserver has begun to shut down.

At SIGTERM Triton refuses new requests and unloads the models, but a model's unload (and so its
`finalize`) waits for its requests in flight: `finalize` comes too late to end a decoupled model's
streams. Streams that call other models over BLS learn it from the refused call ("Server not
ready"); streams whose work stays in the process ask the same way: every `interval_s` one BLS
call to a model that does not exist (`ask`, triton_io.ask_missing_model), answered at once with
"not ready" while the server serves and with "Server not ready" once it stops. Not
`pb_utils.is_model_ready`: while the calling model unloads, 24.10 never answers it (seen in 1 of
5 shutdowns here; the stream threads then held the exit for its whole timeout).

**Why it asks nothing before the model's first request (`arm`).** Two facts of 24.10:
- Triton also answers "Server not ready" while it *starts* (until its last model has loaded),
  so before the server has served, that answer does not mean a shutdown.
- A BLS call that reaches the parent process after Triton began to finalize the instance and
  before the stub learned it (python_backend r24.10 `~ModelInstanceState`: `thread_pool_->wait()`,
  then the finalize message to the stub) is queued on a thread pool that no longer runs, and
  destroying that pool later touches freed shared memory: tritonserver dies with SIGSEGV in
  `pthread_mutex_lock` under `TRITONBACKEND_ModelInstanceFinalize`. Seen in CI with an idle server
  whose watch kept asking through the shutdown; reproduced outside the project
  (perf/finalize_repro/). A call made during `finalize` itself is refused by the stub, harmlessly.
So the watch asks only once the model has served a request (Triton routes requests only when
every model has loaded; before that there are no streams to end), and stops asking at the first
"Server not ready": its last call is answered within one interval of SIGTERM, before Triton
begins to finalize the instance (measured 1.0 s after SIGTERM idle, more under load).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ..contract.errors import is_shutting_down

log = logging.getLogger(__name__)


class ServerStopWatch:
    def __init__(self, ask: Callable[[], str], on_stop: Callable[[], None], interval_s: float = 0.25) -> None:
        self.ask, self.on_stop, self.interval_s = ask, on_stop, interval_s
        self.asked = 0  # calls made (tests read it)
        self._armed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="moss-server-stop-watch", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        """The model got a request, so the server serves: start asking. Cheap; every execute() calls it."""
        self._armed.set()

    def _watch(self) -> None:
        while not self._armed.wait(self.interval_s):
            if self._stop.is_set():
                return
        while not self._stop.wait(self.interval_s):
            self.asked += 1
            try:
                message = self.ask()
            except Exception as exc:  # never the end of the watch: it would miss the shutdown
                message = f"{type(exc).__name__}: {exc}"
            if is_shutting_down(message):
                log.info("tritonserver is shutting down (%s)", message)
                self.on_stop()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval_s)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()
