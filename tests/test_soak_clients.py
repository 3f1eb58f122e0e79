"""perf/soak.py's client processes on the CPU, without a server: a client process that dies is
named in the report with its signal or exit code, the others are told to stop, the end checks still
run, and the soak never hangs. The loads here stand in for run_load; they are module functions
because the client processes are spawned and import them by name."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

from client.server_health import MODELS
from http_endpoint import HttpEndpoint
from perf.soak import main
from perf.soak_clients import run_clients
from perf.soak_load import Soak, SoakConfig, SoakReport
from shared_state import SharedCounter

LOAD_S = 60.0  # the loads' length: far beyond any test's bound, so only a stop ends them early
BOUND_S = 20.0  # a test's run_clients must return by then


def config(seconds: float = LOAD_S, concurrency: int = 3) -> SoakConfig:
    return SoakConfig("127.0.0.1:1", concurrency, seconds, response_timeout_s=1.0)


def until_stopped(config: SoakConfig, index: int, stop) -> SoakReport:
    """A client process's load that runs until it is told to stop or its seconds pass."""
    stop.wait(config.seconds)
    report = SoakReport(wall_seconds=1.0)
    report.outcomes["stream ok"] += 1
    return report


def sigkill_in_1(config: SoakConfig, index: int, stop) -> SoakReport:
    if index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return until_stopped(config, index, stop)


def sigkill_in_1_others_failing(config: SoakConfig, index: int, stop) -> SoakReport:
    """As sigkill_in_1, but the survivors report more failures than the summary keeps (20)."""
    report = sigkill_in_1(config, index, stop)
    report.failures += [f"stream: failure {i} of client {index}" for i in range(25)]
    return report


def exit_3_in_1(config: SoakConfig, index: int, stop) -> SoakReport:
    if index == 1:
        os._exit(3)
    return until_stopped(config, index, stop)


def raise_in_0(config: SoakConfig, index: int, stop) -> SoakReport:
    if index == 0:
        raise RuntimeError("the load broke")
    return until_stopped(config, index, stop)


def sigkill_in_0_deaf_1(config: SoakConfig, index: int, stop) -> SoakReport:
    """Process 0 dies; process 1 never looks at the stop."""
    if index == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    if index == 1:
        time.sleep(config.seconds)
    return until_stopped(config, index, stop)


def timed_run(*args, **kwargs) -> tuple[SoakReport, float]:
    start = time.monotonic()
    report = run_clients(*args, **kwargs)
    took = time.monotonic() - start
    assert took < BOUND_S, f"run_clients took {took:.1f} s"
    return report, took


def assert_failure(report: SoakReport, *words: str) -> None:
    assert not report.ok
    assert any(all(w in f for w in words) for f in report.failures), (words, report.failures)


def test_a_killed_client_process_is_named_and_the_others_stop(capfd):
    report, _ = timed_run(config(), 3, sigkill_in_1)
    assert_failure(report, "client process 1 (pid", "died without a report", "signal 9 (SIGKILL)")
    assert len(report.failures) == 1, report.failures
    assert report.outcomes["stream ok"] == 2  # the survivors stopped early and their reports count
    err = capfd.readouterr().err
    assert "died without a report" in err and "told to stop" in err


def test_an_exit_without_a_report_names_the_exit_code():
    report, _ = timed_run(config(), 2, exit_3_in_1)
    assert_failure(report, "client process 1", "died without a report", "exit code 3")


def test_a_load_that_raises_is_a_failure_with_its_traceback(capfd):
    report, _ = timed_run(config(seconds=0.5), 2, raise_in_0)
    assert_failure(report, "soak client 0: the load raised RuntimeError: the load broke")
    assert report.outcomes["stream ok"] == 1
    err = capfd.readouterr().err
    assert "Traceback" in err and "RuntimeError: the load broke" in err
    assert "soak client 1: finished normally" in err


def test_a_client_process_deaf_to_the_stop_is_terminated_after_the_grace():
    report, took = timed_run(config(), 2, sigkill_in_0_deaf_1, grace_s=1.0)
    assert_failure(report, "client process 0", "SIGKILL")
    assert_failure(report, "client process 1", "had not ended after the stop", "SIGTERM")


def test_every_client_process_ends_normally():
    report, _ = timed_run(config(seconds=0.2, concurrency=5), 3, until_stopped)
    assert report.ok and report.failures == [] and report.outcomes["stream ok"] == 3


def test_an_exception_in_a_worker_is_counted_and_shown(capsys):
    soak = Soak(config(), client=None, reference=b"", label="soak client 2")

    async def broken(rng):
        raise KeyError("no such output")

    soak.one = broken
    soak.deadline = time.monotonic() + 5.0
    asyncio.run(soak.worker(7))
    assert soak.report.failures == ["worker: 7: KeyError: 'no such output'"]
    err = capsys.readouterr().err
    assert "soak client 2: KeyError escaped worker 7" in err and "Traceback" in err
    line = soak.progress(12.0)
    assert line.startswith("soak client 2: 12 s, 1 requests ended, 1 failed, 0 in flight, rss ") and line.endswith(" MiB")


def test_the_stop_ends_the_load_of_a_client_process(capsys):
    soak = Soak(config(), client=None, reference=b"", label="soak client 4")
    soak.deadline = time.monotonic() + LOAD_S
    stop = threading.Event()
    stop.set()

    async def watch_briefly():
        try:
            await asyncio.wait_for(soak.watch(time.monotonic(), stop), 1.0)
        except asyncio.TimeoutError:
            pass

    asyncio.run(watch_briefly())
    assert soak.deadline <= time.monotonic()
    assert "soak client 4: told to stop" in capsys.readouterr().err


MAX_RUNNING = 4
_BEATS = SharedCounter()  # scraped on the metrics server's threads, one per request


def idle_metrics() -> bytes:
    """An idle server's metrics, every heartbeat one further on each scrape: settle() finds nothing."""
    beat = _BEATS.add()
    lines = [f'moss_engine{{model_instance="moss_tts_0",stat="{stat}"}} {value}'
             for stat, value in (("streams", 0), ("running", 0), ("waiting", 0), ("free_slots", MAX_RUNNING))]
    lines.append('moss_vocoder_sessions{model_instance="vocoder_0",state="active"} 0')
    lines += [f'moss_heartbeat_total{{model="{m}",model_instance="{m}_0"}} {beat}' for m in MODELS]
    return ("\n".join(lines) + "\n").encode()


def test_main_writes_a_failed_report_when_a_client_process_dies(tmp_path):
    metrics = HttpEndpoint(idle_metrics)
    out = tmp_path / "soak.json"
    try:
        start = time.monotonic()
        code = main(["--processes", "3", "--concurrency", "6", "--seconds", str(LOAD_S), "--settle", "2",
                     "--max-running", str(MAX_RUNNING), "--metrics-url", metrics.url, "--out", str(out)],
                    load=sigkill_in_1_others_failing)
        took = time.monotonic() - start
    finally:
        metrics.close()
    assert code == 1 and took < BOUND_S, (code, took)
    report = json.loads(out.read_text())
    assert report["ok"] is False and report["num_failures"] == 51 and report["requests"] == 2, report
    assert "client process 1" in report["failures"][0] and "SIGKILL" in report["failures"][0], report  # kept first
    assert report["end_problems"] == [] and report["end_state"], report  # the end checks ran
