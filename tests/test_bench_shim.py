"""perf/bench_shim.py, the benchmark of the OpenAI shim alone, runs end to end on the CPU: its fake
`moss_tts` takes exactly the real contract and chunk settings (its chunks are the engine's
chunk_target), and the load's every transport gets the audio it asked for (the figures themselves are perf/RESULTS.md's, not a test's)."""

from __future__ import annotations

import json
import re

import pytest

from triton_server import ROOT


def _inputs(config: str) -> set[str]:
    block = config[config.index("\ninput ["):config.index("\noutput [")]
    return set(re.findall(r'name: "([A-Z_]+)"', block))


def test_the_fake_takes_the_real_contract_and_chunk_settings():
    from perf.fake_tts_server import FakePace, fake_config, real_parameter

    real = (ROOT / "model_repository" / "moss_tts" / "config.pbtxt").read_text()
    fake = fake_config(FakePace())
    assert _inputs(fake) == _inputs(real) and len(_inputs(real)) > 10
    assert re.search(r"decoupled:\s*true", fake)
    for key in ("first_chunk_frames", "chunk_frames"):
        assert real_parameter(fake, key) == real_parameter(real, key)


@pytest.mark.triton
def test_the_shim_benchmark_serves_every_transport_in_full(tmp_path):
    from perf.bench_shim import main

    out = tmp_path / "shim.json"
    # The fake at 2,000 frames/s, sessions fed 400 words/s: this checks that every transport gets all
    # its audio, not the pace (62.5 frames/s and 20 words/s made it 2 minutes of waiting here).
    assert main(["--workers", "1", "--concurrency", "1", "--transports", "grpc,http,sse,grpc_session,ws",
                 "--requests", "1", "--processes", "1", "--frames-per-s", "2000", "--words-per-s", "400",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    levels = {level["transport"]: level for level in report["runs"][0]["levels"]}
    assert set(levels) == {"grpc", "http", "sse", "grpc_session", "ws"}
    for level in levels.values():
        assert level["failures"] == 0 and level["audio_s"] > 0, level
    for transport in ("http", "sse", "ws"):
        assert levels[transport]["shim_cpu_s"] > 0  # the shim's CPU was read from /proc
    assert {row["transport"] for row in report["runs"][0]["added_first_audio"]} == {"http", "sse", "ws"}
