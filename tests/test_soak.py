"""Stress on the real server: concurrent streams, random cancels at random points and bad input
for a few minutes (perf/soak.py), then every engine row and vocoder slot free, every model
instance's heartbeat moving, no crash in the log, and a shutdown inside Triton's exit timeout
that leaves no stub behind. MOSS_SOAK_SECONDS sets the length (90); from 600 s on, the RSS of
tritonserver and of every stub must stay within 5% from a quarter of the run to its end
(MOSS_SOAK_REPORT=path writes the soak's report and the RSS samples as JSON).

Known and open (docs/structure.md, "Shutdown after a cancel-heavy soak"): in some runs Triton
keeps a reference to `moss_tts` after the load although every stream has ended and its stub is
idle, so `moss_tts` is never finalized and Triton exits at its 30 s exit timeout. That case is
reported as a warning here; the strict unload checks live in tests/test_shutdown.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from pathlib import Path

import pytest

from perf.soak import SoakConfig, soak
from triton_server import live_stubs, start_server, stop_server, stub_pids

pytestmark = pytest.mark.triton
SECONDS = float(os.environ.get("MOSS_SOAK_SECONDS", "90"))
REPORT = Path(os.environ["MOSS_SOAK_REPORT"]) if os.environ.get("MOSS_SOAK_REPORT") else None
SHUTDOWN_S = 25.0  # under Triton's 30 s exit timeout, with room
EXIT_TIMEOUT_S = 30.0  # Triton's default --exit-timeout-secs: it exits by then whatever holds it
CRASHES = ("is not healthy", "Traceback", "free(): invalid", "double free", "Segmentation fault", "stalled")


def rss_mib(pid: int) -> float:
    """Resident memory of a live process in MiB (nan once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return float("nan")


class RssSampler:
    """RSS of tritonserver and every stub every 10 s while the soak runs."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids, self.samples = pids, []  # [(seconds since start, {name: MiB})]
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic() - self._start, {n: rss_mib(p) for n, p in self.pids.items()}))
            if self._stop.wait(10.0):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic() - self._start, {n: rss_mib(p) for n, p in self.pids.items()}))

    def growth(self) -> dict[str, tuple[float, float]]:
        """{name: (MiB at a quarter of the run, after warm-up; MiB at the end)}."""
        end_t, end = self.samples[-1]
        _, warm = next(s for s in self.samples if s[0] >= end_t / 4)
        return {name: (warm[name], end[name]) for name in end}


def test_soak_leaves_nothing_behind_and_shuts_down_cleanly(tiny_dir, tmp_path):
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp_path / "server.log")
    stubs = stub_pids(server)
    rss = RssSampler({"tritonserver": server.process.pid, **stubs})
    try:
        config = SoakConfig(server.grpc_url, concurrency=12, seconds=SECONDS, cancel_fraction=0.25,
                            bad_fraction=0.1, min_frames=4, max_frames=24, response_timeout_s=60.0)
        try:
            report = soak(config, server.metrics_url, server.parameter("moss_tts", "max_running_requests"))
        finally:
            rss.stop()
        growth = rss.growth()
        if REPORT:  # the long run's record (perf/RESULTS.md): the soak's report and the memory
            REPORT.write_text(json.dumps({"seconds": SECONDS, "soak": report.summary(), "rss_mib": rss.samples,
                                          "rss_quarter_to_end_mib": growth}, indent=1))
        if SECONDS >= 600:  # long enough to tell a leak from warm-up: flat within 5% after a quarter
            grew = {n: (a, b) for n, (a, b) in growth.items() if b > 1.05 * a}
            assert not grew, f"RSS grew more than 5% from a quarter of the run to its end (MiB): {grew}"
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

