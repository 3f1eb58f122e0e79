"""The Triton adapters stay thin, and product files small (docs/structure.md, "The layout"): each model_repository/*/1/model.py
wires the package's parts and converts tensors, and the policy lives in the package, where it is
tested without Triton. Counted here so an adapter cannot grow back unnoticed (issue 33: moss_tts's
had grown from 201 to 417 lines, 80 of them session policy). A product file (python_backends/,
model_repository/, client/) has at most 300 lines; only a kernel may have more, and it says why in
a comment line beginning "# Over 300 lines"."""

from __future__ import annotations

import ast

import pytest

from conftest import ROOT

MAX_LINES = {"moss_tts": 250, "vocoder": 150, "ref_encoder": 150}
MAX_FILE_LINES = 300
PRODUCT_DIRS = ("python_backends", "model_repository", "client")
KERNELS = ROOT / "python_backends" / "moss_tts" / "kernels"


def adapter(model: str) -> str:
    return (ROOT / "model_repository" / model / "1" / "model.py").read_text()


def test_every_adapter_is_counted():
    assert {p.parent.parent.name for p in (ROOT / "model_repository").glob("*/1/model.py")} == set(MAX_LINES)


@pytest.mark.parametrize("model", sorted(MAX_LINES))
def test_an_adapter_stays_within_its_lines(model):
    lines = len(adapter(model).splitlines())
    assert lines <= MAX_LINES[model], (f"model_repository/{model}/1/model.py has {lines} lines, more than "
                                       f"{MAX_LINES[model]}: move the policy into python_backends/moss_tts")


def test_the_moss_tts_adapter_defines_nothing_but_its_model():
    """No functions or classes of its own beside TritonPythonModel: a stream's Triton side is
    serving/stream_io.py, its policy pipeline/speech_requests.py and sessions/admission.py."""
    tree = ast.parse(adapter("moss_tts"))
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    assert defined == ["TritonPythonModel"]


def long_files() -> dict:
    """Every product .py file over MAX_FILE_LINES: {path: lines}."""
    files = (path for folder in PRODUCT_DIRS for path in (ROOT / folder).rglob("*.py"))
    counts = {path: len(path.read_text().splitlines()) for path in files}
    return {path: lines for path, lines in counts.items() if lines > MAX_FILE_LINES}


def test_no_product_file_is_over_300_lines_but_a_kernel_that_says_why():
    long = long_files()
    others = {str(path.relative_to(ROOT)): lines for path, lines in long.items() if KERNELS not in path.parents}
    assert not others, f"over {MAX_FILE_LINES} lines: {others}; split them by noun (docs/structure.md, 'The layout')"
    unexplained = [str(path.relative_to(ROOT)) for path in long
                   if not any(line.startswith("# Over 300 lines") for line in path.read_text().splitlines())]
    assert not unexplained, f"kernels over {MAX_FILE_LINES} lines with no '# Over 300 lines' comment: {unexplained}"
