"""Heartbeat-based health (client/server_health.py) and the shim's 503s when a heart stops,
against a fake metrics endpoint whose counters the test moves."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from client.openai_shim.config import ShimConfig
from client.server_health import HeartbeatMonitor, check, metrics_url_for, parse_heartbeats
from http_endpoint import HttpEndpoint
from shared_state import SharedCounter

INSTANCES = {("moss_tts", "moss_tts_0_0"): 1, ("ref_encoder", "ref_encoder_0_0"): 1, ("vocoder", "vocoder_0_0"): 1}


def exposition(beats: dict) -> str:
    lines = ["# TYPE moss_heartbeat_total counter"]
    lines += [f'moss_heartbeat_total{{model="{m}",model_instance="{i}"}} {v}' for (m, i), v in beats.items()]
    return "\n".join(lines + ['moss_engine{stat="running"} 0', "nv_inference_count 5"]) + "\n"


def test_parse_and_metrics_url():
    assert parse_heartbeats(exposition(INSTANCES)) == {k: 1.0 for k in INSTANCES}
    assert metrics_url_for("10.0.0.5:8001") == "http://10.0.0.5:8002/metrics"


def test_monitor_flags_a_counter_that_stops_and_clears_when_it_moves():
    now = [0.0]
    beats = dict(INSTANCES)
    monitor = HeartbeatMonitor("unused", stale_after_s=3.0, clock=lambda: now[0])
    assert monitor.poll(exposition(beats)) is None
    for t in range(1, 6):  # vocoder_0_0 stops beating at t=0
        now[0] = float(t)
        beats = {k: (v if k[0] == "vocoder" else v + 2) for k, v in beats.items()}
        problem = monitor.poll(exposition(beats))
    assert "vocoder_0_0 (vocoder) has had no heartbeat for 5 s" in problem and "restart" in problem
    assert "moss_tts_0_0" not in problem
    beats[("vocoder", "vocoder_0_0")] += 1
    assert monitor.poll(exposition(beats)) is None


def test_monitor_wants_every_model():
    beats = {k: v for k, v in INSTANCES.items() if k[0] != "ref_encoder"}
    assert "'ref_encoder' reports no heartbeat" in HeartbeatMonitor("unused").poll(exposition(beats))


def test_unreachable_metrics_are_a_problem():
    assert "unreachable" in HeartbeatMonitor("http://127.0.0.1:1/metrics").poll()


class FakeMetrics:
    """An HTTP metrics endpoint; while `beating` is set the counters move by one per scrape. Scrapes
    run on the server's threads, one per request, while the test flips `beating`: the moves are a
    SharedCounter and the flag an Event (tests/shared_state.py)."""

    def __init__(self):
        self.moves, self.beating = SharedCounter(), threading.Event()
        self.beating.set()
        self.endpoint = HttpEndpoint(self._scrape)
        self.url = self.endpoint.url

    def _scrape(self) -> bytes:
        moves = self.moves.add() if self.beating.is_set() else self.moves.value()
        return exposition({k: v + moves for k, v in INSTANCES.items()}).encode()

    def close(self):
        self.endpoint.close()


@pytest.fixture
def metrics():
    fake = FakeMetrics()
    yield fake
    fake.close()


def test_one_shot_check(metrics):
    assert check(metrics.url, window_s=0.4) is None
    metrics.beating.clear()
    assert "no heartbeat" in check(metrics.url, window_s=0.4)


def test_shim_answers_503_while_a_heart_has_stopped(metrics):
    from shim_server import ShimThread
    from test_openai_shim_units import FakeStream, FakeTriton

    config = ShimConfig(metrics_url=metrics.url, heartbeat_stale_s=1.0)
    with ShimThread(config, FakeTriton(FakeStream([]))) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        metrics.beating.clear()
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/health").status_code != 503:
            assert time.monotonic() < deadline, "the shim never noticed the stopped heartbeat"
        health = httpx.get(f"{url}/health").json()
        assert "no heartbeat" in health["error"]["message"]
        speech = httpx.post(f"{url}/v1/audio/speech", json={"input": "Hello."})
        assert speech.status_code == 503 and "unhealthy" in speech.json()["error"]["message"]
        metrics.beating.set()
        deadline = time.monotonic() + 10
        while httpx.get(f"{url}/health").status_code != 200:
            assert time.monotonic() < deadline, "the shim never recovered"
