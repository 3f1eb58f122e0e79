"""Let a tritonserver pod's streams finish before it gets SIGTERM (the Kubernetes preStop hook).

  python -m client.drain [--metrics-url http://127.0.0.1:8002/metrics] [--settle 40] [--budget 150]

tritonserver 24.10 ends every in-flight stream the moment SIGTERM arrives (each gets
"[UNAVAILABLE] the server is shutting down; retry (on another replica)"), so the waiting must
happen before the signal. The pod is already out of its Services when this starts, but a client
may still open streams on a connection it holds until that connection is closed
(tritonserver --grpc-max-connection-age) and it resolves the name again: `--settle` covers that.
Then it waits until this server's `moss_engine{stat="streams"}` is 0, up to `--budget` seconds in
all. It always exits 0: the signal follows either way (docs/kubernetes.md, "Drain").
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Callable, Optional

from .server_health import fetch

_STREAMS = re.compile(r'^moss_engine\{[^}]*\bstat="streams"[^}]*\} (\S+)$', re.M)


def count_streams(text: str) -> int:
    """Streams in flight (every moss_tts instance) from Prometheus text; 0 when none is loaded."""
    return int(sum(float(value) for value in _STREAMS.findall(text)))


UNREADABLE_POLLS = 5  # consecutive failed reads after --settle: the server is gone, stop waiting


def read_streams(metrics_url: str) -> Optional[int]:
    """Streams in flight, or None when the metrics cannot be read this time."""
    try:
        return count_streams(fetch(metrics_url, timeout_s=5.0))
    except OSError:
        return None


def wait_for_drain(streams: Callable[[], Optional[int]], settle_s: float, budget_s: float, poll_s: float = 1.0,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str:
    """Poll `streams()` until, after `settle_s`, none is left, or `budget_s` has passed; -> what happened.

    A failed read is "unknown", not "drained": a pod full of streams is when /metrics is slowest.
    Only UNREADABLE_POLLS failures in a row after `settle_s` end the wait early."""
    start, failures = clock(), 0
    while True:
        elapsed, open_streams = clock() - start, streams()
        failures = failures + 1 if open_streams is None else 0
        if failures >= UNREADABLE_POLLS and elapsed >= settle_s:
            return f"metrics unreadable {failures} times in a row after {elapsed:.0f} s: nothing to wait for"
        if open_streams == 0 and elapsed >= settle_s:
            return f"drained after {elapsed:.0f} s"
        if elapsed >= budget_s:
            left = "an unknown number of" if open_streams is None else open_streams
            return f"{left} streams still open after {elapsed:.0f} s: SIGTERM ends them"
        sleep(poll_s)


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m client.drain", description=__doc__.split("\n\n")[0])
    p.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics", help="this pod's tritonserver metrics")
    p.add_argument("--settle", type=float, default=40.0,
                   help="seconds to wait at least: clients' connections to this pod close and they resolve again")
    p.add_argument("--budget", type=float, default=150.0, help="seconds to wait at most, --settle included")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"drain: {wait_for_drain(lambda: read_streams(args.metrics_url), args.settle, args.budget)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
