"""The image runs the stack the tests run (issue 22).

requirements.txt is the one pin list: `make setup` installs it (scripts/setup_env.sh), the image
runs that same script, the shim image and the H200 pack take their versions from it
(scripts/pins.py). (a) Every file that builds an environment agrees with the list and carries no
package version of its own; the docs state the image's Python, torch, CUDA and driver. (b) This
session's environment is the image's without Docker (torch's CUDA 13.0 wheel included, run on the CPU): the Python
minor, every pin importable at its version, and the `triton` fixture's tritonserver (the one the
other server tests use) is the wheel's 2.51.0 running the image's 3.11 stub on these packages,
serving a stream.
"""

from __future__ import annotations

import filecmp
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import sysconfig
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE_IMAGE = "python:{python}-slim-bookworm"  # both stages (Dockerfile header, docs/kubernetes.md)
SERVER_OF_PYTRITON = {"0.7.0": "2.51.0"}  # the tritonserver each nvidia-pytriton wheel carries
BOX_PYTHON = "3.12"  # the H200 box's own Python: the device pack's stub and wheels
BOX_TORCH_TRITON = ("2.11.0", "3.6.0")  # the H200 box's own torch (2.11.0+cu130) and Triton
# Pins an environment that runs the models must import (pin name -> module).
RUNTIME_MODULES = {"torch": "torch", "numpy": "numpy", "transformers": "transformers", "tokenizers": "tokenizers",
                   "safetensors": "safetensors", "soundfile": "soundfile", "xxhash": "xxhash", "triton": "triton",
                   "tritonclient": "tritonclient.grpc", "python-rapidjson": "rapidjson"}
# NAME==1, NAME>=1, NAME<2 ... in code (comments are free to quote versions).
VERSION_LITERAL = re.compile(r"\b[A-Za-z][\w.-]*(\[[\w,]+\])?\s*(==|>=|<=|~=|!=|<|>)\s*\d")


def load_pins_module():
    spec = importlib.util.spec_from_file_location("pins", ROOT / "scripts" / "pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pins_module = load_pins_module()
PIN_TEXT = (ROOT / "requirements.txt").read_text()
PINS = pins_module.read_pins(PIN_TEXT)
FACTS = pins_module.read_facts(PIN_TEXT)


# ---------------------------------------------------------------------------------------------
# Helpers: a file's code lines, its scripts/pins.py calls, the Dockerfile's stages


def code(path: Path) -> str:
    """The file without comments, continuation lines joined (Dockerfile and shell)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.strip().startswith("#"):
            lines.append(re.sub(r"\s+#\s.*$", "", line))
    return re.sub(r"\\\n", " ", "\n".join(lines))


def version_literals(text: str) -> list[str]:
    return [m.group(0) for m in VERSION_LITERAL.finditer(text)]


def pins_requests(text: str) -> list[list[str]]:
    """The package arguments of every `scripts/pins.py NAME...` call in `text` (not --fact, --stack)."""
    calls = re.findall(r"python3? scripts/pins\.py ([^>&|\n]*)", text)
    return [shlex.split(args) for args in calls if args.strip() and not args.startswith("--")]


def dockerfile_stages() -> dict[str, tuple[str, str]]:
    """{stage name: (base image, the stage's code)}, in order."""
    stages = re.split(r"^FROM ", code(ROOT / "Dockerfile"), flags=re.M)[1:]
    found = {}
    for stage in stages:
        base, _as, name = stage.split()[:3]
        assert _as == "AS", f"name every stage: FROM {base} AS <name>"
        found[name] = (base, stage)
    return found


def python_minor() -> str:
    return "%d.%d" % sys.version_info[:2]


# ---------------------------------------------------------------------------------------------
# (a) The files agree with the pin list


def test_the_pin_list_states_one_consistent_stack():
    assert re.fullmatch(r"3\.\d+", FACTS["python"])
    assert re.fullmatch(r"\d+\.\d+", FACTS["torch-cuda"]) and re.fullmatch(r"\d+\.\d+\.\d+", FACTS["nvidia-driver"])
    assert {"torch", "triton", "numpy", "transformers", "tokenizers", "nvidia-pytriton", "tritonclient"} <= PINS.keys()
    server = SERVER_OF_PYTRITON.get(PINS["nvidia-pytriton"])
    assert server, f"which tritonserver does nvidia-pytriton {PINS['nvidia-pytriton']} carry? add it to SERVER_OF_PYTRITON"
    assert PINS["tritonclient"] == server, "the client (and its perf_analyzer) must match the server"
    assert int(PINS["numpy"].split(".")[0]) < 2, "the 24.10 stub mis-reads BYTES tensors with numpy 2"


def test_the_dockerfile_builds_both_images_from_the_pin_list():
    stages = dockerfile_stages()
    assert list(stages) == ["shim", "triton"], "tritonserver's stage is the last: the default target"
    for name, (base, _) in stages.items():
        assert base == BASE_IMAGE.format(python=FACTS["python"]), f"{name}: the image's Python is the list's"
    triton = stages["triton"][1]
    require = re.search(r'NVIDIA_REQUIRE_CUDA="cuda>=([\d.]+)"', triton)
    assert require and require.group(1) == FACTS["torch-cuda"]
    literals = version_literals(triton.replace(require.group(0), "")) + version_literals(stages["shim"][1])
    assert not literals, f"versions belong in requirements.txt only: {literals}"
    # The triton stage: `make setup`'s script, the pins first (cached), a CUDA build of torch, then the rest.
    runs = re.findall(r"^RUN (.*)$", triton, re.M)
    assert runs[1].startswith("PIP_NO_CACHE_DIR=1 scripts/setup_env.sh pins")
    assert "torch.version.cuda" in runs[1] and "scripts/pins.py --fact torch-cuda" in runs[1]
    assert runs[2].startswith("scripts/setup_env.sh &&")
    assert "ln -s /opt/moss-tts-triton/scripts/tritonserver /usr/local/bin/tritonserver" in runs[2]
    assert json.loads(re.search(r"^CMD (\[.*\])$", triton, re.M).group(1))[0] == "tritonserver"
    assert re.search(r"^ENV PATH=/opt/moss-tts-triton/\.venv/bin:\$PATH", triton, re.M)
    # The shim: its packages at the list's versions.
    (shim_packages,) = pins_requests(stages["shim"][1])
    assert pins_module.pinned(shim_packages, PIN_TEXT)
    assert "pip install --no-cache-dir -r /tmp/shim-requirements.txt" in stages["shim"][1]


def test_make_setup_installs_the_pin_list_with_its_python():
    setup = code(ROOT / "scripts" / "setup_env.sh")
    assert not version_literals(setup), version_literals(setup)
    # uv, pinned in the list and installed by pip, installs the list with pip's index settings
    assert '.venv/bin/pip install -q --disable-pip-version-check "$(python3 scripts/pins.py uv)"' in setup
    assert "uv pip install -q --python .venv/bin/python $(.venv/bin/python scripts/uv_args.py) -r requirements.txt" in setup
    assert "uv" in PINS
    assert 'python_minor="$(python3 scripts/pins.py --fact python)"' in setup
    assert 'PY=${PYTHON:-$(command -v "python$python_minor" || echo python3)}' in setup
    assert re.search(r"^setup:\n\t@scripts/setup_env.sh$", (ROOT / "Makefile").read_text(), re.M)


def test_the_device_pack_takes_its_versions_from_the_pin_list():
    pack = code(ROOT / "scripts" / "device_triton_pack.sh")
    assert not version_literals(pack), version_literals(pack)
    (packages,) = pins_requests(pack)
    assert pins_module.pinned(packages, PIN_TEXT)
    assert re.search(r"^box_python=(\S+)$", pack, re.M).group(1) == BOX_PYTHON
    assert 'python_backend_stubs/$box_python/triton_python_backend_stub' in pack
    assert '--python-version "$box_python"' in pack and '-r "$p/PINS"' in pack
    # Its env.sh compares the box's own torch and Triton with the pins in every run that sources it,
    # and hands the line to the results (MOSS_STACK).
    assert 'export MOSS_STACK="$(python3 scripts/pins.py --stack)' in pack and "$_pack/PINS" in pack


def test_the_agent_frameworks_stay_out_of_the_servers_venv():
    """Pipecat and LiveKit pull numpy 2 (the 24.10 stub needs 1.x): scripts/check_agents.sh installs
    their own exact pins into .agents-venv, never into .venv."""
    agents = pins_module.read_pins((ROOT / "requirements-agents.txt").read_text())
    lines = [line for line in (ROOT / "requirements-agents.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert len(agents) == len(lines) >= 3, "pin every framework exactly (name==version)"
    assert not agents.keys() & PINS.keys(), "a framework in requirements.txt would reach the server's .venv"
    check = code(ROOT / "scripts" / "check_agents.sh")
    assert "venv=.agents-venv" in check and '"$venv/bin/pip" install' in check and "-r requirements-agents.txt" in check
    assert ".venv/bin/pip" not in check and "/.agents-venv/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_stack_line_shows_a_mismatch_in_bold():
    versions = {"torch": f"{PINS['torch']}+cu130", "triton": PINS["triton"]}
    assert pins_module.stack_line(PIN_TEXT, versions.get) == (
        f"stack: torch {PINS['torch']}+cu130, triton {PINS['triton']}: as pinned")
    versions["torch"] = "2.13.0"
    line = pins_module.stack_line(PIN_TEXT, versions.get)
    assert line == f"stack: **MISMATCH with the pins: torch 2.13.0 (requirements.txt: {PINS['torch']})**"
    assert "**MISMATCH" in pins_module.stack_line(PIN_TEXT, {}.get)  # neither installed


def test_the_pins_are_the_h200_boxs_torch_and_triton():
    """The tests, the image and every GPU figure run one stack: the box's own torch 2.11.0 (cu130)
    with Triton 3.6.0, which nothing can replace there (the device tool's KINDS.md)."""
    assert (PINS["torch"], PINS["triton"]) == BOX_TORCH_TRITON


def test_docs_state_the_images_python_torch_cuda_and_driver():
    stated = {"base image": BASE_IMAGE.format(python=FACTS["python"]), "Python": f"Python {FACTS['python']}",
              "torch": f"torch {PINS['torch']}", "CUDA": f"CUDA {FACTS['torch-cuda']}",
              "driver": FACTS["nvidia-driver"], "tritonserver": SERVER_OF_PYTRITON[PINS["nvidia-pytriton"]]}
    for doc in ("README.md", "docs/kubernetes.md"):
        text = re.sub(r"\s+", " ", (ROOT / doc).read_text())
        missing = [what for what, value in stated.items() if value not in text]
        assert not missing, f"{doc} does not state the image's {', '.join(missing)}"
    assert f"Python {BOX_PYTHON}" in (ROOT / "docs" / "kubernetes.md").read_text()


def test_pins_script_prints_the_lists_versions_and_refuses_what_it_lacks():
    assert pins_module.pinned(["tritonclient[grpc]", "Python_Multipart"], PIN_TEXT) == [
        f"tritonclient[grpc]=={PINS['tritonclient']}", f"Python_Multipart=={PINS['python-multipart']}"]
    with pytest.raises(KeyError, match="not-a-pin"):
        pins_module.pinned(["numpy", "not-a-pin"], PIN_TEXT)
    run = subprocess.run([sys.executable, "scripts/pins.py", "--fact", "python"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert (run.returncode, run.stdout.strip()) == (0, FACTS["python"])


def test_the_images_tritonserver_is_started_as_serve_sh_starts_it(tmp_path):
    """/usr/local/bin/tritonserver in the image is a link to scripts/tritonserver: it finds
    triton_env.sh through the link and passes the backend directory, as scripts/serve.sh does."""
    wrapper, serve = (ROOT / "scripts" / "tritonserver").read_text(), (ROOT / "scripts" / "serve.sh").read_text()
    for script in (wrapper, serve):
        assert re.search(r"source .*triton_env\.sh", script), "the tests' server environment"
        assert '"$TRITONSERVER"' in script and '--backend-directory="$TRITON_BACKENDS"' in script
    (tmp_path / "tritonserver").symlink_to(ROOT / "scripts" / "tritonserver")
    helped = subprocess.run([str(tmp_path / "tritonserver"), "--help"], capture_output=True, text=True, timeout=60)
    assert "--backend-directory" in helped.stdout + helped.stderr, helped.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# (b) This environment is the image's, without Docker


@pytest.fixture
def image_python() -> str:
    """The image's Python minor; skips where this session runs another one."""
    if python_minor() != FACTS["python"]:
        pytest.skip(f"the image runs Python {FACTS['python']} (requirements.txt, Dockerfile); this session runs "
                    f"{python_minor()}, so its environment is not the image's. To check it: "
                    f"rm -rf .venv && PYTHON=python{FACTS['python']} make test")
    return FACTS["python"]


def test_this_environment_has_every_pin_and_imports_the_runtime(image_python):
    installed = {name: version(name) for name in PINS}
    # torch: PyPI's wheel has no local label; a local build (+cpu, +cu130) of the same release is the same stack.
    installed["torch"] = installed["torch"].split("+")[0]
    assert installed == PINS
    for module in RUNTIME_MODULES.values():
        importlib.import_module(module)


@pytest.mark.triton
def test_the_test_server_is_the_images_server_stub_and_packages(image_python, triton):
    """The `triton` fixture (scripts/serve.sh, as every server test) runs what the image runs: the
    wheel's tritonserver 2.51.0, the wheel's stub for the image's Python, the pinned packages."""
    from client.tts_client import TTSClient, build_inputs
    from triton_server import stub_pids

    site = Path(sysconfig.get_paths()["purelib"]).resolve()  # /proc shows real paths
    server = site / "pytriton" / "tritonserver"
    assert Path(f"/proc/{triton.process.pid}/exe").resolve() == (server / "bin" / "tritonserver").resolve()
    metadata = json.loads(urllib.request.urlopen(f"http://{triton.http_url}/v2", timeout=10).read())
    assert metadata["version"] == SERVER_OF_PYTRITON[PINS["nvidia-pytriton"]] == PINS["tritonclient"]
    stubs = stub_pids(triton)
    assert {"moss_tts", "vocoder", "ref_encoder"} <= {name.rsplit("_", 2)[0] for name in stubs}, stubs
    image_stub = server / "python_backend_stubs" / image_python / "triton_python_backend_stub"
    for name, pid in stubs.items():
        assert filecmp.cmp(Path(f"/proc/{pid}/exe").resolve(), image_stub, shallow=False), name
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert f"libpython{image_python}.so" in maps, f"{name}: not the image's Python"
        assert str(site / "numpy") in maps, f"{name}: numpy is not the pinned one of {site}"
        if name.startswith(("moss_tts", "vocoder")):
            assert str(site / "torch" / "lib") in maps, f"{name}: torch is not the pinned one of {site}"
    utterance = TTSClient(triton.grpc_url).synthesize(build_inputs(
        "The image's stack.", seed=1, max_frames=4, ignore_stop=True, stream=True, first_chunk_frames=2, chunk_frames=2))
    assert len(utterance.chunks) == 2 and utterance.audio.shape[0] == 2


def test_uv_gets_pips_index_settings():
    import importlib.util

    spec = importlib.util.spec_from_file_location("uv_args", ROOT / "scripts" / "uv_args.py")
    uv_args = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(uv_args)
    listed = ("global.cert='/etc/ssl/certs/ca-certificates.crt'\n"
              "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
              "global.find-links='/opt/wheels'\n:env:.find-links='/opt/wheels'\n"
              "global.index-url='https://mirror.example/simple'\n")
    # pip's main index first (the extra ones after it), as pip sees every index's wheels of a version
    assert uv_args.uv_args(listed, {}) == [
        "--index-strategy", "unsafe-best-match", "--index", "https://mirror.example/simple",
        "--index", "file:///opt/a/simple", "--index", "file:///opt/b/simple", "--find-links", "/opt/wheels"]
    assert uv_args.uv_args("", {"PIP_NO_CACHE_DIR": "1"}) == [
        "--index-strategy", "unsafe-best-match", "--index", "https://pypi.org/simple", "--no-cache"]
