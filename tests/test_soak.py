"""Stress on the real server: concurrent streams, random cancels at random points and bad input
for a minute (perf/soak.py; the H200 soaks run minutes: perf/h200_scaling.sh soak), then every engine row and vocoder slot free, every model
instance's heartbeat moving, no crash in the log, moss_tts's request ledger in agreement with
Triton's own counters, and a shutdown in which every model, moss_tts included, unloads within
25 s of SIGTERM and no stub is left behind. MOSS_SOAK_SECONDS sets the length (60); from 600 s
on, the RSS of tritonserver and of every stub must stay within 5% from a quarter of the run to
its end (MOSS_SOAK_REPORT=path writes the soak's report and the RSS samples as JSON).

The unload is asserted, not warned about: a model still loaded 25 s after SIGTERM is the hold of
docs/structure.md ("Shutdown after a cancel-heavy soak"), and the failure names the models still
live and carries what the server showed at that moment (Triton's metrics, the ledger, the stubs).
One line per run (`soak: ...`) reports the counts and each model's unload time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from perf.soak import soak
from perf.soak_load import SoakConfig
from triton_server import MODELS, live_stubs, start_server, stub_pids

pytestmark = pytest.mark.triton
SECONDS = float(os.environ.get("MOSS_SOAK_SECONDS", "60"))
REPORT = Path(os.environ["MOSS_SOAK_REPORT"]) if os.environ.get("MOSS_SOAK_REPORT") else None
SHUTDOWN_S = 25.0  # every model unloaded and tritonserver gone by then: under its 30 s exit timeout
HOLD_CHECK_S = 8.0  # a model still loaded this long after SIGTERM (an idle server: ~1-3 s): take evidence
LEDGER = "moss_tts_requests"
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


def triton_counts(metrics_url: str, model: str) -> dict[str, float]:
    """Triton's own nv_inference_* series for one model, summed over its versions, without the
    prefix: {'request_success': n, 'request_failure{reason="CANCELED"}': n, ...}."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode("utf-8", "replace")
    counts: dict[str, float] = {}
    for m in re.finditer(r"^nv_inference_(\w+)\{([^}]*)\} (\S+)$", text, re.M):
        if f'model="{model}"' not in m.group(2):
            continue
        rest = ",".join(x for x in m.group(2).split(",") if not x.startswith(("model=", "version=")))
        key = f"{m.group(1)}{{{rest}}}" if rest else m.group(1)
        counts[key] = counts.get(key, 0.0) + float(m.group(3))
    return counts


def ledger_counts(metrics: dict[str, float]) -> dict[str, float]:
    """moss_tts's request ledger from read_metrics(): {'entered': n, 'finals': n, 'in_flight': n, ...}."""
    return {k[len(LEDGER) + len('{stat="'):-2]: v for k, v in metrics.items() if k.startswith(LEDGER + "{")}


def hold_evidence(server, stubs: dict[str, int]) -> str:
    """What the server shows while a model is still loaded after SIGTERM: Triton's counters for
    moss_tts, the ledger (its gauge thread runs until the model is finalized), the stubs' states."""
    parts = []
    try:
        counts = triton_counts(server.metrics_url, "moss_tts")
        parts.append(f"Triton moss_tts: { {k: v for k, v in counts.items() if not k.endswith('_us')} }")
        parts.append(f"ledger: {ledger_counts(server.metrics())}")
    except OSError as exc:
        parts.append(f"metrics endpoint: {exc}")
    for name, pid in stubs.items():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            state = re.search(r"^State:\s+(.*)$", status, re.M).group(1)
            threads = re.search(r"^Threads:\s+(\d+)$", status, re.M).group(1)
            parts.append(f"stub {name} pid {pid}: {state}, {threads} threads")
        except OSError:
            parts.append(f"stub {name} pid {pid}: gone")
    return "\n".join(parts)


def stop_and_time_unloads(server, stubs: dict[str, int], timeout: float = 60.0) -> tuple[float, dict, str]:
    """SIGTERM (to the process group, as stop_server), then watch the log until tritonserver exits:
    -> (seconds to exit (inf: SIGKILL after `timeout`), {model: seconds to its "successfully
    unloaded" line}, evidence taken if a model was still loaded HOLD_CHECK_S after SIGTERM)."""
    start = time.monotonic()
    unloaded: dict[str, float] = {}
    evidence = ""
    os.killpg(server.process.pid, signal.SIGTERM)
    while True:
        exited = server.process.poll() is not None
        log = server.log_path.read_text(errors="replace")
        now = time.monotonic() - start
        for model in MODELS:
            if model not in unloaded and f"successfully unloaded '{model}'" in log:
                unloaded[model] = now
        if exited:
            return now, unloaded, evidence
        if not evidence and now > HOLD_CHECK_S and len(unloaded) < len(MODELS):
            evidence = f"{now:.1f} s after SIGTERM, {sorted(set(MODELS) - set(unloaded))} still loaded:\n"
            evidence += hold_evidence(server, stubs)
            (server.log_path.parent / "hold_evidence.txt").write_text(evidence)
        if now > timeout:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()
            return float("inf"), unloaded, evidence
        time.sleep(0.1)


def test_soak_leaves_nothing_behind_and_shuts_down_cleanly(tiny_dir, tmp_path, capsys):
    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp_path / "server.log")
    stubs = stub_pids(server)
    rss = RssSampler({"tritonserver": server.process.pid, **stubs})
    seen = "load not finished"
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
        seen = f"{summary['requests']} requests"
        assert report.ok, summary
        outcomes = report.outcomes
        # Half the cancels are gRPC cancels, half in-band STOPs (the shim's AudioStream.aclose).
        assert outcomes["cancelled"] >= 5 and outcomes["stopped"] >= 5, summary
        assert outcomes["bad input rejected"] >= 5, summary
        assert sum(v for k, v in outcomes.items() if k.endswith(" ok")) >= 50, summary
        assert outcomes["busy"] == 0, summary  # 12 streams are far under capacity

        # The model's ledger beside Triton's own counters, once the load is over (the ledger's gauge
        # settled). What Triton 2.51 counts for a decoupled Python model (measured request kind by
        # kind, docs/structure.md): nv_inference_request_success goes up per request when
        # execute() RETURNS, not at its final response: a stream still running already counts, and
        # streams cancelled before or after their first response and requests the model refuses
        # (an error response, sent from execute) all count as successes. So it is the ledger's
        # `entered`. failure{reason="BACKEND"} would count the requests of an execute() that raised
        # (ours never raises; those requests would be in `entered` too); failure{CANCELED|REJECTED}
        # is for requests cancelled or refused in Triton's queue, before execute (never in the
        # ledger; none seen); a wrong-dtype input is refused before the model and counted nowhere.
        # nv_inference_pending_request_count counts only requests waiting for execute. Triton has
        # no in-flight view of a decoupled request after execute: its counters confirm `entered`;
        # `finals` (in_flight = 0) is the ledger's alone, and a hold at shutdown shows in neither.
        ledger = ledger_counts(server.settled_metrics())
        triton = triton_counts(server.metrics_url, "moss_tts")
        failures = {k: v for k, v in triton.items() if k.startswith("request_failure") and v}
        seen = (f"{summary['requests']} requests; ledger entered={ledger['entered']:g} finals={ledger['finals']:g} "
                f"in_flight={ledger['in_flight']:g}; Triton moss_tts success={triton['request_success']:g} "
                f"failure={failures or 0} pending={triton['pending_request_count']:g}")
        assert triton["request_success"] == ledger["entered"], seen
        assert triton.get('request_failure{reason="BACKEND"}', 0.0) == 0, seen
        assert triton["pending_request_count"] == 0 and ledger["in_flight"] == 0 == ledger["double_finals"], seen
        # A STOP that met its request's final in flight stops nothing but is answered all the same.
        assert 1 <= ledger["stopped"] <= outcomes["stopped"], (seen, ledger["stopped"])
    finally:
        took, unloaded, evidence = stop_and_time_unloads(server, stubs)
        with capsys.disabled():  # in the run's output whether the test passes or fails
            times = ", ".join(f"{m} {unloaded[m]:.1f} s" if m in unloaded else f"{m} NOT UNLOADED" for m in MODELS)
            print(f"\nsoak: {seen}; SIGTERM -> exit {took:.1f} s; unloaded after SIGTERM: {times}; "
                  f"server log {server.log_path}", flush=True)
    log = server.log_path.read_text(errors="replace")
    found = [needle for needle in CRASHES if needle in log]
    assert not found, f"{found} in the server log:\n{server.log_tail(120)}"
    live = [model for model in MODELS if unloaded.get(model, float("inf")) >= SHUTDOWN_S]
    assert not live, (f"{live} still loaded {SHUTDOWN_S:.0f} s after SIGTERM (tritonserver exited after {took:.1f} s): "
                      "the hold described in docs/structure.md, 'Shutdown after a cancel-heavy soak'.\n"
                      f"{evidence or 'no evidence taken'}\nserver log {server.log_path}:\n{server.log_tail()}")
    assert took < SHUTDOWN_S, f"shutdown took {took:.1f} s\n{server.log_tail()}"
    alive = live_stubs(stubs)
    assert not alive, f"stubs outlived tritonserver: {alive}"
