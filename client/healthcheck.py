"""Health of a moss-tts-triton server, for probes and operators.

  python -m client.healthcheck [--url localhost:8001] [--metrics-url URL] [--live] [--probe] [--timeout 30]

Exit 0 when healthy, 1 otherwise (the reason is printed). Checks, in order:
1. tritonserver's gRPC frontend answers and says ready (with --live: says live);
2. every model instance's heartbeat moves (client/server_health.py): Triton 24.10 keeps saying
   ready when a Python stub has died, so this is what tells a dead or wedged stub;
3. with --probe, one frame of speech comes back through the public entry (end to end).
Readiness probe: without --probe (cheap, every few seconds). Liveness probe: --live, failing only
after a long run of failures (deploy/k8s/triton.yaml), so a server is restarted when a stub stays
dead or wedged (its heartbeat stands still; 2.51's gRPC stream-handler deadlock shows this way, a
send that never returns, docs/structure.md) or its gRPC frontend does not answer at all. An HTTP
/v2/health/live probe sees neither: Triton 24.10 says live with a dead stub, and the wedge left
the HTTP side answering (perf/RESULTS.md, issue 34 round 18).
"""

from __future__ import annotations

import argparse
import sys
import threading

from .server_health import check, metrics_url_for
from .tts_client import SAMPLE_RATE, TTSClient, build_inputs

SAMPLES_PER_FRAME = SAMPLE_RATE * 2 // 25  # 3840: one 80 ms codec frame


def _bounded(work, timeout: float) -> str | None:
    """Run work() -> problem|None on a thread; a hang is a problem too."""
    result: dict = {}

    def run():
        try:
            result["problem"] = work()
        except Exception as exc:  # any failure means unhealthy
            result["problem"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    return result.get("problem", f"no answer within {timeout:.0f} s")


def probe(url: str, timeout: float) -> str | None:
    """End to end: one frame of speech through moss_tts. None when healthy, else what went wrong."""
    def work():
        inputs = build_inputs("health check", seed=0, max_frames=1, ignore_stop=True, stream=False)
        audio = TTSClient(url).synthesize(inputs).audio
        return None if audio.shape == (2, SAMPLES_PER_FRAME) else f"unexpected audio {audio.shape}"
    return _bounded(work, timeout)


def _grpc_says(url: str, timeout: float, state: str) -> str | None:
    """tritonserver's gRPC frontend answers ServerLive / ServerReady (`state`: "live" / "ready")
    with yes, within timeout."""
    def work():
        import tritonclient.grpc as grpcclient
        client = grpcclient.InferenceServerClient(url)
        says = client.is_server_live if state == "live" else client.is_server_ready
        return None if says(client_timeout=timeout) else f"tritonserver is not {state}"
    return _bounded(work, timeout)


def live(url: str, timeout: float) -> str | None:
    """ServerLive over gRPC: served by the frontend that carries the streams, unlike the HTTP
    port's /v2/health/live."""
    return _grpc_says(url, timeout, "live")


def ready(url: str, timeout: float) -> str | None:
    return _grpc_says(url, timeout, "ready")


def diagnose(url: str, metrics_url: str, with_probe: bool, timeout: float, liveness: bool = False) -> str | None:
    return ((live if liveness else ready)(url, timeout) or _bounded(lambda: check(metrics_url), timeout)
            or (probe(url, timeout) if with_probe else None))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="localhost:8001", help="tritonserver gRPC address")
    p.add_argument("--metrics-url", default=None, help="default: http://<host of --url>:8002/metrics")
    p.add_argument("--live", action="store_true", help="liveness: gRPC ServerLive instead of ServerReady")
    p.add_argument("--probe", action="store_true", help="also synthesize one frame end to end")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per check")
    args = p.parse_args(argv)
    problem = diagnose(args.url, args.metrics_url or metrics_url_for(args.url), args.probe, args.timeout, args.live)
    print("healthy" if problem is None else f"unhealthy: {problem}")
    return 0 if problem is None else 1


if __name__ == "__main__":
    sys.exit(main())
