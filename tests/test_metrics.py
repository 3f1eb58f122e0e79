"""The operator's numbers: per-request series of moss_tts on the real server, and the Grafana
dashboard (deploy/grafana) reading only series the server really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from client.server_health import fetch
from client.tts_client import InferenceServerException, TTSClient, build_inputs

pytestmark = pytest.mark.triton
DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "moss-tts-triton.json"


# The pipeline's in-process histograms (the vocoder model's own, moss_vocoder_batch_size, counts
# only its direct callers).
HISTOGRAMS = ("moss_engine_batch_size", "moss_engine_step_ms", "moss_tts_vocoder_round_rows")


def test_a_request_shows_in_the_request_series(triton):
    before = triton.settled_metrics()
    TTSClient(triton.grpc_url).synthesize(build_inputs("Hello.", seed=1, max_frames=5, ignore_stop=True))
    with pytest.raises(InferenceServerException):
        TTSClient(triton.grpc_url).synthesize(build_inputs("Hello.", top_p=5.0))
    delta = lambda m, series: m.get(series, 0.0) - before.get(series, 0.0)  # noqa: E731
    # Observed after each final response is sent, published by the gauge threads: wait for them.
    moved = ["moss_tts_rtf_count", 'moss_tts_requests_total{outcome="invalid"}'] + [f"{h}_count" for h in HISTOGRAMS]
    after = triton.wait_for_metrics(lambda m: all(delta(m, series) > 0 for series in moved), timeout=10)
    assert delta(after, 'moss_tts_requests_total{outcome="ok"}') == 1
    assert delta(after, 'moss_tts_requests_total{outcome="invalid"}') == 1
    assert delta(after, "moss_tts_audio_seconds_total") == pytest.approx(5 / 12.5)
    assert delta(after, "moss_tts_time_to_first_audio_seconds_count") == 1
    assert delta(after, "moss_tts_rtf_count") == 1 and delta(after, "moss_tts_rtf_sum") > 0
    # the engine's and the in-process vocoder's histograms, published by their gauge threads
    for name in HISTOGRAMS:
        assert delta(after, f"{name}_count") > 0, name
        assert after[f'{name}_bucket{{le="+Inf"}}'] == after[f"{name}_count"], name
    # The model's ledger: both requests entered and got their final flag; none is in flight.
    ledger = lambda m, stat: m.get(f'moss_tts_requests{{stat="{stat}"}}')  # noqa: E731
    after = triton.wait_for_metrics(lambda m: delta(m, 'moss_tts_requests{stat="finals"}') == 2, timeout=5)
    assert delta(after, 'moss_tts_requests{stat="entered"}') == 2
    assert (ledger(after, "in_flight"), ledger(after, "double_finals"), ledger(after, "send_errors")) == (0, 0, 0)
    from moss_tts.serving.request_ledger import PATHS

    assert all(ledger(after, f"in_flight_{path}") == 0 for path in PATHS)  # per path, published too


def test_every_series_the_dashboard_reads_exists(triton):
    TTSClient(triton.grpc_url).synthesize(build_inputs("Hello.", seed=2, max_frames=2, ignore_stop=True))
    exported = fetch(triton.metrics_url, 10.0)
    names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", exported, re.M))
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    assert len(exprs) >= 8
    for expr in exprs:
        for name in re.findall(r"\b((?:moss|nv)_[a-z_]+)\b", expr):
            assert name in names, f"{name} (in {expr!r}) is not exported"
        for name, label, wanted in re.findall(r"\b((?:moss|nv)_[a-z_]+)\{(\w+)=\"([^\"]+)\"\}", expr):
            series = re.compile(rf'^{name}\{{[^}}]*\b{label}="{re.escape(wanted)}"', re.M)  # other labels may follow
            assert series.search(exported), f"{name}{{{label}={wanted!r}}} is not exported"


def test_speak_stats_prints_what_each_model_did(triton, tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "client.speak", "Hello.", "-o", str(tmp_path / "a.wav"), "--url",
                          triton.grpc_url, "--seed", "1", "--max-frames", "4", "--stats"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model"))
    rows = {line.split()[0]: line.split() for line in lines[header + 1:]}
    assert "moss_tts" in rows and int(rows["moss_tts"][1]) == 1  # one request
    # The pipeline decodes in its own process: the vocoder model (direct callers) did nothing.
    assert "vocoder" not in rows or int(rows["vocoder"][1]) == 0
