"""End-to-end liveness probe: synthesize one frame through the public entry.

  python -m client.healthcheck [--url localhost:8001] [--timeout 30]

Exit 0 when audio comes back, 1 otherwise. Triton 24.10 does not restart a crashed Python
stub and keeps answering /v2/health/ready with 200, so readiness alone cannot tell a dead
pipeline from a live one; this probe can (use it as a Docker/Kubernetes liveness command).
"""

from __future__ import annotations

import argparse
import sys
import threading

from .tts_client import SAMPLE_RATE, TTSClient, build_inputs

SAMPLES_PER_FRAME = SAMPLE_RATE * 2 // 25  # 3840: one 80 ms codec frame


def probe(url: str, timeout: float) -> str | None:
    """None when healthy, else what went wrong."""
    result: dict = {}

    def run():
        try:
            inputs = build_inputs("health check", seed=0, max_frames=1, ignore_stop=True, stream=False)
            audio = TTSClient(url).synthesize(inputs).audio
            result["error"] = None if audio.shape == (2, SAMPLES_PER_FRAME) else f"unexpected audio {audio.shape}"
        except Exception as exc:  # any failure means unhealthy
            result["error"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    return result.get("error", f"no answer within {timeout:.0f} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="localhost:8001")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    problem = probe(args.url, args.timeout)
    print("healthy" if problem is None else f"unhealthy: {problem}")
    return 0 if problem is None else 1


if __name__ == "__main__":
    sys.exit(main())
