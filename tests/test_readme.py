"""Every command README.md prints runs as printed (issue 14).

Each fenced bash/python block runs as one script (`bash -euo pipefail`, or the venv's python) in a
scratch directory whose `.venv` links to this checkout's, with PYTHONPATH removed: the editable
install of scripts/setup_env.sh must be enough. Blocks that talk to a server run against the
`triton` / `openai_shim` fixtures (marked triton); only the addresses are rewritten. Inline
`.venv/bin/python …` commands run the same way. Anything that needs real weights, a GPU or minutes
is skipped with its reason, and a command no rule below claims fails: classify it here.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
HEADING = re.compile(r"^#+ (.+)$", re.M)
INLINE = re.compile(r"(?<!`)`(\.venv/bin/python [^`…]+)`(?!`)")  # "… -m …" is prose, not a command
OUTPUT = re.compile(r"(?:\s-o|--output|--out-\w+)\s+(\S+)|write_to_file\(\"([^\"]+)\"\)")
TIMEOUT_S = 300


@dataclass(frozen=True)
class Command:
    """A fenced block or an inline command of README.md, and how this test treats it."""

    lang: str
    code: str
    line: int
    section: str
    fenced: bool

    @property
    def kind(self) -> str:
        """make | skip | agents | shim | triton | cpu | unknown (first rule that matches)."""
        if "hf download" in self.code:
            return "skip"
        if re.search(r"^from (pipecat|livekit)\.", self.code, re.M):
            return "agents"
        if self.lang == "bash" and all(line.startswith("make ") for line in self.lines()):
            return "make"
        if "localhost:8080" in self.code:
            return "shim"
        if "localhost:8001" in self.code or "client.speak" in self.code:
            return "triton"
        if self.lang == "bash":
            return "cpu"
        return "unknown"

    def lines(self) -> list[str]:
        """Commands without comments, continuation lines joined."""
        joined = self.code.replace("\\\n", " ")
        return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]

    def outputs(self) -> list[str]:
        return [a or b for a, b in OUTPUT.findall(self.code)]

    @property
    def id(self) -> str:
        where = "inline" if not self.fenced else self.lang
        return f"README.md:{self.line} {where} ({self.section})"


SKIP_REASONS = {
    "skip": "needs the real weights from the Hugging Face Hub (no downloads here) and a machine to serve them",
    "agents": "a voice-agent framework's set-up (numpy 2: its own venv; a transport, an LLM): "
              "scripts/check_agents.sh runs these TTS services against a real server",
}


def readme_commands(text: str) -> list[Command]:
    prose = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)  # fences blanked, same offsets
    headings = [(m.start(), m.group(1)) for m in HEADING.finditer(prose)]

    def section(pos: int) -> str:
        return next((title for start, title in reversed(headings) if start < pos), "top")

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    commands = [Command(m.group(1) or "text", m.group(2), line(m.start()), section(m.start()), True)
                for m in FENCE.finditer(text)]
    commands += [Command("bash", " ".join(m.group(1).split()), line(m.start()), section(m.start()), False)
                 for m in INLINE.finditer(prose)]
    return commands


def _params():
    params = []
    for command in readme_commands(README.read_text()):
        marks = []
        if command.kind in SKIP_REASONS:
            marks.append(pytest.mark.skip(reason=SKIP_REASONS[command.kind]))
        elif command.kind in ("triton", "shim"):
            marks.append(pytest.mark.triton)
        params.append(pytest.param(command, id=command.id, marks=marks))
    return params


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A scratch directory where `.venv/bin/python` is this checkout's interpreter."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    return tmp_path


def run_script(command: Command, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if command.lang == "python":
        argv = [str(cwd / ".venv" / "bin" / "python"), "-c", code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", code]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def assert_ran(command: Command, result: subprocess.CompletedProcess, cwd: Path) -> None:
    assert result.returncode == 0, (
        f"{command.id} failed (exit {result.returncode}):\n{command.code}\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
    for name in command.outputs():
        assert_output(cwd / name, (24000, 1) if command.kind == "shim" else (48000, 2))


def assert_output(path: Path, wav_layout: tuple[int, int]) -> None:
    """Written, and audio rather than an error body (curl writes a 4xx body to -o as well); a wav has
    the layout its source sends: the shim OpenAI's 24 kHz mono, the gRPC clients 48 kHz stereo."""
    assert path.is_file(), f"{path.name} was not written"
    if path.suffix == ".wav":
        import soundfile as sf

        info = sf.info(str(path))
        assert (info.samplerate, info.channels) == wav_layout, (path.name, info)
    elif path.suffix == ".pcm":
        assert not path.read_bytes()[:1] == b"{", f"{path.name}: {path.read_bytes()[:300]!r}"
    else:
        assert path.stat().st_size > 0, f"{path.name} is empty"


def for_triton(code: str, server) -> str:
    """README addresses -> the test server's. client.speak's default --url is localhost:8001 too, and
    client.healthcheck reads metrics from port 8002 of the --url host unless told otherwise."""
    code = code.replace("localhost:8001", server.grpc_url)
    code = re.sub(r"-m client\.speak (?!.*--url)", f"-m client.speak --url {server.grpc_url} ", code)
    return re.sub(r"-m client\.healthcheck (?!.*--metrics-url)", f"-m client.healthcheck --metrics-url {server.metrics_url} ",
                  code)


@pytest.mark.parametrize("command", _params())
def test_readme_command(command: Command, workdir: Path, request):
    if command.kind == "unknown":
        pytest.fail(f"{command.id}: no rule in tests/test_readme.py says how to run this README command")
    if command.kind == "make":
        targets = [line.split("#")[0].split()[1:] for line in command.lines()]
        for target in targets:
            result = subprocess.run(["make", "-n", *target], cwd=ROOT, capture_output=True, text=True)
            assert result.returncode == 0, f"make {' '.join(target)}: {result.stderr}"
        return  # `make test` is this suite; `make serve` runs scripts/serve.sh, as the triton fixture does
    code = command.code
    if command.kind == "triton":
        code = for_triton(code, request.getfixturevalue("triton"))
    elif command.kind == "shim":
        url = request.getfixturevalue("openai_shim").url
        code = code.replace("http://localhost:8080", url).replace("ws://localhost:8080", "ws" + url[len("http"):])
    assert_ran(command, run_script(command, code, workdir), workdir)


def test_every_kind_of_command_is_found():
    """The parser still sees the blocks this test exists for (a broken fence would hide them)."""
    kinds = [c.kind for c in readme_commands(README.read_text())]
    assert {"make", "skip", "triton", "shim", "cpu"} <= set(kinds), kinds
