"""tritonserver serving the fake `moss_tts` (perf/fake_tts/model.py): silence at a set pace with
the real chunk schedule, no model, so that what stands in front of the server can be measured on
a CPU (perf/bench_shim.py).

The repository is made on the fly: the real config.pbtxt's name, decoupled policy, inputs and
outputs (so the fake takes exactly what `moss_tts` takes), one CPU instance, the real
`first_chunk_frames` / `chunk_frames`, and the fake's pace.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from perf.hold_repro.repro import Server

ROOT = Path(__file__).resolve().parents[1]
REAL_CONFIG = ROOT / "model_repository" / "moss_tts" / "config.pbtxt"
MODEL = Path(__file__).resolve().parent / "fake_tts" / "model.py"
CHUNK_PARAMETERS = ("first_chunk_frames", "chunk_frames")


@dataclass(frozen=True)
class FakePace:
    frames_per_s: float = 62.5  # per stream: 5x real time, about the real server's pace at 128 streams
    first_chunk_ms: float = 20.0  # before a request's first frame (the real one's prefill)
    frames_per_char: float = 0.8  # length without IGNORE_STOP: ~15 characters of English per second


def real_parameter(config: str, key: str) -> str:
    match = re.search(rf'key: "{key}" value: {{ string_value: "([^"]*)" }}', config)
    if match is None:
        raise ValueError(f"{REAL_CONFIG} has no parameter {key}")
    return match.group(1)


def fake_config(pace: FakePace) -> str:
    """The real config's contract (up to its outputs, without its comments) + the fake's settings."""
    real = REAL_CONFIG.read_text()
    end = real.index("\n]", real.index("\noutput [")) + 2
    contract = "\n".join(line for line in real[:end].splitlines() if not line.startswith("#"))
    values = {key: real_parameter(real, key) for key in CHUNK_PARAMETERS}
    values |= {"frames_per_s": pace.frames_per_s, "first_chunk_ms": pace.first_chunk_ms,
               "frames_per_char": pace.frames_per_char}
    parameters = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items())
    return (f"# perf/fake_tts_server.py: the fake moss_tts (perf/fake_tts/model.py)\n{contract}\n"
            f"instance_group [ {{ count: 1, kind: KIND_CPU }} ]\n{parameters}")


def make_repository(directory: Path, pace: FakePace) -> Path:
    repo = directory / "fake_repository"
    (repo / "moss_tts" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL, repo / "moss_tts" / "1" / "model.py")
    (repo / "moss_tts" / "config.pbtxt").write_text(fake_config(pace))
    return repo


def start_fake_server(directory: Path, pace: FakePace = FakePace()) -> Server:
    """The fake, ready (its gRPC address: f"127.0.0.1:{server.grpc}"); `server.stop()` ends it."""
    server = Server(make_repository(directory, pace), directory / "fake_server.log")
    try:
        server.wait_ready(["moss_tts"])
    except BaseException:
        server.stop()
        raise
    return server
