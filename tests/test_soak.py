"""Stress on the real server: concurrent streams, random cancels at random points and bad input
for a few minutes (perf/soak.py), then every engine row and vocoder slot free, every model
instance's heartbeat moving, no crash in the log, and a shutdown inside Triton's exit timeout
that leaves no stub behind. MOSS_SOAK_SECONDS sets the length (150).

Known and open (docs/structure.md, "Shutdown after a cancel-heavy soak"): in some runs Triton
keeps a reference to `moss_tts` after the load although every stream has ended and its stub is
idle, so `moss_tts` is never finalized and Triton exits at its 30 s exit timeout. That case is
reported as a warning here; the strict unload checks live in tests/test_shutdown.py.
"""

from __future__ import annotations

import os
import warnings

import pytest

from perf.soak import SoakConfig, soak
from triton_server import live_stubs, start_server, stop_server, stub_pids

pytestmark = pytest.mark.triton
SECONDS = float(os.environ.get("MOSS_SOAK_SECONDS", "150"))
SHUTDOWN_S = 25.0  # under Triton's 30 s exit timeout, with room
EXIT_TIMEOUT_S = 30.0  # Triton's default --exit-timeout-secs: it exits by then whatever holds it
CRASHES = ("is not healthy", "Traceback", "free(): invalid", "double free", "Segmentation fault", "stalled")


def test_soak_leaves_nothing_behind_and_shuts_down_cleanly(tiny_dir, tmp_path):
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp_path / "server.log")
    stubs = stub_pids(server)
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
    found = [needle for needle in CRASHES if needle in log]
    assert not found, f"{found} in the server log:\n{server.log_tail(120)}"
    for model in ("ref_encoder", "vocoder", "moss_tts_codes"):
        assert f"successfully unloaded '{model}'" in log, f"{model} never unloaded\n{server.log_tail()}"
    alive = live_stubs(stubs)
    assert not alive, f"stubs outlived tritonserver: {alive}"
    if "successfully unloaded 'moss_tts'" in log:
        assert took < SHUTDOWN_S, f"shutdown took {took:.1f} s\n{server.log_tail()}"
    else:
        assert took < EXIT_TIMEOUT_S + 5, f"shutdown took {took:.1f} s\n{server.log_tail()}"
        warnings.warn(f"moss_tts was not unloaded after the soak; Triton exited at its exit timeout ({took:.0f} s): "
                      "the known open shutdown issue (docs/structure.md)")

