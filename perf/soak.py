"""Soak: many concurrent streams against a running server, random cancels and bad input mixed in,
then proof that nothing is left behind.

  python -m perf.soak --url localhost:8001 --metrics-url http://localhost:8002/metrics \
      --concurrency 256 --seconds 600 --cancel-fraction 0.2 --min-frames 40 --max-frames 112 --out soak.json

Every worker runs one request after another until the time is up. A request is, by chance:
a cancel (before its first response or after 1-3 chunks: the gRPC stream's cancel, or for
`--stop-share` of them an in-band STOP), a bad
input (must end in one INVALID_ARGUMENT error, or Triton's own rejection for a wrong dtype),
or a normal request: streamed audio, STREAM=false, CODES only, a clone, a continuation, or the
moss_tts_codes ensemble. Normal requests use IGNORE_STOP, so their length is known and checked.
After the load: within `--settle` seconds no stream, engine row or vocoder session may be in
use, and every model instance's heartbeat must move (client/server_health.py). Exit 0 when
all of it holds; the JSON report says what happened (tests/test_soak.py runs a short one).

While it runs, every client process writes one progress line to stderr every 10 s (requests ended,
failures, requests in flight and the oldest one's age, its RSS) and one line when it is done. A
client process that dies is named in the report with its exit code or signal, the others are told
to stop, and the end checks still run (tests/test_soak_clients.py).

The parts: soak_load.py (one process's load and its report), soak_clients.py (the client
processes), soak_metrics.py (the end checks, from the server's metrics).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path


from perf.soak_clients import checked_load, run_clients
from perf.soak_load import Load, SoakConfig, SoakReport, load_in_process
from perf.soak_metrics import settle


def soak(config: SoakConfig, metrics_url: str, max_running: int, settle_s: float = 30.0,
         processes: int = 1, load: Load = load_in_process) -> SoakReport:
    """The load (here, or in `processes` client processes: run_clients), then the end checks,
    whatever became of the load."""
    report = checked_load(load, config, 0) if processes <= 1 else run_clients(config, processes, load)
    try:
        metrics, report.end_problems = settle(metrics_url, max_running, settle_s)
    except OSError as exc:  # a server that no longer answers: that is the end checks' finding
        metrics, report.end_problems = {}, [f"metrics at {metrics_url}: {type(exc).__name__}: {exc}"]
    report.end_state = {k: v for k, v in metrics.items()
                        if "engine" in k or "vocoder" in k or "heartbeat" in k or k.startswith("moss_tts_requests{")}
    return report


def main(argv=None, load: Load = load_in_process) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="localhost:8001")
    p.add_argument("--metrics-url", default="http://localhost:8002/metrics")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--cancel-fraction", type=float, default=0.2)
    p.add_argument("--stop-share", type=float, default=0.5,
                   help="of the cancelled requests, the share ended by an in-band STOP (as the OpenAI shim and "
                        "client.tts_client do) instead of a gRPC cancel")
    p.add_argument("--bad-fraction", type=float, default=0.1)
    p.add_argument("--min-frames", type=int, default=6)
    p.add_argument("--max-frames", type=int, default=30)
    p.add_argument("--max-running", type=int, default=256, help="moss_tts max_running_requests summed over its instances (free slots when idle; 512 on replicas_2gpu)")
    p.add_argument("--settle", type=float, default=30.0)
    p.add_argument("--processes", type=int, default=1, help="client processes sharing the concurrency")
    p.add_argument("--response-timeout", type=float, default=120.0,
                   help="seconds a stream may wait for its next response before it is cancelled and failed")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    config = SoakConfig(args.url, args.concurrency, args.seconds, args.cancel_fraction, args.bad_fraction,
                        args.min_frames, args.max_frames, args.response_timeout, stop_share=args.stop_share)
    report = soak(config, args.metrics_url, args.max_running, args.settle, args.processes, load)
    summary = {"config": asdict(config), **report.summary()}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
