"""End-to-end offline CLI on the tiny checkpoint: reference wav -> prompt, codes, audio.

One round trip runs `python -m moss_tts.generate` as a user does (a process of its own); the
others call its `main(argv)` in this process, the same code without a new interpreter importing
torch each time (about 5 s a call on the 2-core machine)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import soundfile as sf

from conftest import ROOT
from moss_tts.generate import main


@dataclass
class CliRun:
    returncode: int
    stderr: str


def run_cli(*args, expect=0, own_process: bool = False) -> CliRun:
    """The CLI with `args`: in this process (`main`, argparse's exits caught), or as a process."""
    if own_process:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python_backends"))
        proc = subprocess.run([sys.executable, "-m", "moss_tts.generate", *map(str, args)],
                              capture_output=True, text=True, env=env, timeout=300)
        run = CliRun(proc.returncode, proc.stderr)
    else:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code
        run = CliRun(code, stderr.getvalue())
    assert run.returncode == expect, run.stderr
    return run


@pytest.fixture(scope="module")
def reference_wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.wav"
    t = np.arange(int(1.5 * 16000)) / 16000
    sf.write(path, (0.2 * np.sin(2 * np.pi * 180 * t)).astype("float32"), 16000)  # mono, 16 kHz
    return path


def test_clone_round_trip(tiny_dir, tmp_path, reference_wav):
    run_cli("--model", tiny_dir / "model", "--text", "${token:30}Hello world", "--reference", reference_wav,
            "--language", "English", "--seed", 7, "--max-frames", 6, "--ignore-stop",
            "--out-prompt", tmp_path / "rows.npy", "--out-codes", tmp_path / "codes.npy", "--out-wav", tmp_path / "o.wav",
            own_process=True)
    rows, codes = np.load(tmp_path / "rows.npy"), np.load(tmp_path / "codes.npy")
    assert rows.shape[1] == 13 and np.issubdtype(rows.dtype, np.integer)
    assert (rows[:, 0] == 151654).sum() == 18  # 1.5 s of reference = 18 whole frames
    assert codes.shape == (6, 12)
    audio, rate = sf.read(tmp_path / "o.wav")
    assert rate == 48000 and audio.shape == (6 * 3840, 2) and np.isfinite(audio).all()


def test_same_seed_same_codes_and_continuation(tiny_dir, tmp_path, reference_wav):
    common = ["--model", tiny_dir / "model", "--text", "again", "--seed", 11, "--max-frames", 5, "--ignore-stop"]
    run_cli(*common, "--out-codes", tmp_path / "a.npy")
    run_cli(*common, "--out-codes", tmp_path / "b.npy")
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    ref_codes = np.random.default_rng(0).integers(0, 1024, (4, 12))
    np.save(tmp_path / "ref.npy", ref_codes)
    run_cli(*common, "--mode", "continuation", "--reference-codes", tmp_path / "ref.npy", "--reference-text",
            "It was ", "--out-prompt", tmp_path / "p.npy", "--out-wav", tmp_path / "c.wav")
    rows = np.load(tmp_path / "p.npy")
    assert np.array_equal(rows[-4:, 1:], ref_codes) and (rows[-4:, 0] == 151656).all()
    assert sf.read(tmp_path / "c.wav")[0].shape == (5 * 3840, 2)  # reference audio cut off


@pytest.mark.parametrize("args, message", [
    (["--text", "  "], "text is empty"),
    (["--text", "hi", "--tokens", "-3"], "--tokens must be in"),
    (["--text", "hi", "--top-p", "0"], "top_p"),
    (["--text", "hi", "--reference", "/nonexistent.wav"], "file not found"),
    (["--text", "hi", "--mode", "continuation"], "continuation mode needs reference"),
])
def test_cli_errors(tiny_dir, args, message):
    proc = run_cli("--model", tiny_dir / "model", *args, expect=2)
    assert message in proc.stderr


def test_unreadable_reference(tiny_dir, tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    assert "could not be decoded" in run_cli("--model", tiny_dir / "model", "--text", "hi", "--reference", bad,
                                             expect=2).stderr
