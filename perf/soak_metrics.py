"""What the server's metrics say once a load is over: moss_* series summed over model instances,
and what is still in use when nothing should be (the soak's end checks; tests use them too).
"""

from __future__ import annotations

import time

from client.server_health import check as heartbeats_move, fetch, parse_series


def read_metrics(metrics_url: str) -> dict[str, float]:
    """Our custom series summed over model instances, e.g. {'moss_engine{stat="running"}': 0.0}."""
    return sum_instances(fetch(metrics_url, 10.0))


def sum_instances(text: str) -> dict[str, float]:
    """Prometheus text -> {series without its `model_instance` label: sum over instances} for moss_*
    series (a multi-GPU layout runs one engine and one vocoder per GPU)."""
    totals: dict[str, float] = {}
    for name, labels, value in parse_series(text, "moss_"):
        kept = ",".join(f'{key}="{label}"' for key, label in labels.items() if key != "model_instance")
        key = f"{name}{{{kept}}}" if kept else name
        totals[key] = totals.get(key, 0.0) + value
    return totals


IN_PROCESS_SESSIONS = 'moss_tts_vocoder{stat="active_slots"}'  # moss_tts's own vocoder (vocoder=in_process)
IN_FLIGHT = 'moss_tts_requests{stat="in_flight"}'  # moss_tts's requests without their final flag yet
DOUBLE_FINALS = 'moss_tts_requests{stat="double_finals"}'


def vocoder_sessions(m: dict[str, float]) -> float:
    """Open codec sequences: the vocoder model's (direct callers, BLS) + moss_tts's in-process ones."""
    return m.get('moss_vocoder_sessions{state="active"}', 0.0) + m.get(IN_PROCESS_SESSIONS, 0.0)


def idle_problems(m: dict[str, float], max_running: int) -> list[str]:
    """What is still in use once every client is gone (empty list = nothing)."""
    wanted = {'moss_engine{stat="streams"}': 0, 'moss_engine{stat="running"}': 0,
              'moss_engine{stat="waiting"}': 0, 'moss_engine{stat="free_slots"}': max_running,
              'moss_vocoder_sessions{state="active"}': 0}
    for name in (IN_PROCESS_SESSIONS, IN_FLIGHT, DOUBLE_FINALS):
        if name in m:  # series of the current moss_tts (older servers lack them)
            wanted[name] = 0
    return [f"{name} is {m.get(name)}, want {value}" for name, value in wanted.items() if m.get(name) != value]


def settle(metrics_url: str, max_running: int, timeout_s: float) -> tuple[dict, list[str]]:
    """Wait until nothing is in use, then check the heartbeats; -> (metrics, problems)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = read_metrics(metrics_url)
        problems = idle_problems(metrics, max_running)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    beat = heartbeats_move(metrics_url)
    return metrics, problems + ([beat] if beat else [])

