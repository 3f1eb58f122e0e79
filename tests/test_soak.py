"""Stress on the real server: concurrent streams, random cancels at random points and bad input
for a few minutes (perf/soak.py), then every engine row and vocoder slot free, every model
instance's heartbeat moving, and a clean shutdown. MOSS_SOAK_SECONDS sets the length (150)."""

from __future__ import annotations

import os

import pytest

from perf.soak import SoakConfig, soak
from triton_server import start_server, stop_server

pytestmark = pytest.mark.triton
SECONDS = float(os.environ.get("MOSS_SOAK_SECONDS", "150"))
SHUTDOWN_S = 25.0  # under Triton's 30 s exit timeout, with room
NOT_IN_LOG = ("Non-graceful termination", "Exit timeout expired", "is not healthy", "Traceback",
              "free(): invalid", "double free", "Segmentation fault", "stalled")


def test_soak_leaves_nothing_behind_and_shuts_down_cleanly(tiny_dir, tmp_path):
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp_path / "server.log")
    try:
        config = SoakConfig(server.grpc_url, concurrency=12, seconds=SECONDS, cancel_fraction=0.25,
                            bad_fraction=0.1, min_frames=4, max_frames=24, response_timeout_s=60.0)
        report = soak(config, server.metrics_url, server.parameter("moss_tts", "max_running_requests"))
        summary = report.summary()
        assert report.ok, summary
        outcomes = report.outcomes
        assert outcomes["cancelled"] >= 10 and outcomes["bad input rejected"] >= 5, summary
        assert sum(v for k, v in outcomes.items() if k.endswith(" ok")) >= 50, summary
        assert outcomes["busy"] == 0, summary  # 12 streams are far under capacity
    finally:
        took = stop_server(server, timeout=60)
    log = server.log_path.read_text(errors="replace")
    assert took < SHUTDOWN_S, f"shutdown took {took:.1f} s\n{server.log_tail()}"
    found = [needle for needle in NOT_IN_LOG if needle in log]
    assert not found, f"{found} in the server log:\n{server.log_tail(120)}"
