"""`python -m moss_tts.codec` round trips (subprocess) and user errors (exit status 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from moss_tts.codec import load_codec, tiny_codec_config_dict, write_codec_checkpoint
from moss_tts.codec.__main__ import main

REPO = Path(__file__).resolve().parents[1]
SPF = 3840


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "python_backends"))
    return subprocess.run([sys.executable, "-m", "moss_tts.codec", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_codec_checkpoint(tmp_path_factory.mktemp("codec"), tiny_codec_config_dict(), seed=3)


def stereo(samples: int) -> np.ndarray:
    t = np.arange(samples) / 48000
    return np.stack([0.4 * np.sin(2 * np.pi * 220 * t), 0.3 * np.sin(2 * np.pi * 330 * t + 1)]).astype(np.float32)


def test_round_trip_subprocess(ckpt, tmp_path):
    audio = stereo(12 * SPF + 700)  # 13 frames, the last one partial
    sf.write(tmp_path / "in.wav", audio.T, 48000, subtype="FLOAT")
    enc = run_cli("encode", tmp_path / "in.wav", "-o", tmp_path / "codes.npy", "--codec", ckpt)
    assert enc.returncode == 0, enc.stderr
    codes = np.load(tmp_path / "codes.npy")
    assert codes.shape == (13, 12) and np.issubdtype(codes.dtype, np.integer)
    codec = load_codec(ckpt)
    # The CLI counts the partial last frame as audio (length rounded up to whole frames).
    expected, _ = codec.encode(torch.from_numpy(audio)[None], torch.tensor([13 * SPF]))
    assert np.array_equal(codes, expected[0].numpy())
    whole_frames_only, _ = codec.encode(torch.from_numpy(audio)[None])
    assert np.array_equal(codes[:12], whole_frames_only[0, :12].numpy())

    for out, extra in (("offline.wav", []), ("offline.npy", []), ("chunked.npy", ["--chunk-frames", "4"])):
        res = run_cli("decode", tmp_path / "codes.npy", "-o", tmp_path / out, "--codec", ckpt, *extra)
        assert res.returncode == 0, res.stderr
    wav, rate = sf.read(tmp_path / "offline.wav", dtype="float32", always_2d=True)
    offline = np.load(tmp_path / "offline.npy")
    chunked = np.load(tmp_path / "chunked.npy")
    assert rate == 48000 and wav.shape == (13 * SPF, 2)
    assert offline.shape == (2, 13 * SPF) and offline.dtype == np.float32
    assert np.array_equal(wav.T, offline)
    peak = np.abs(offline).max()
    assert peak > 1e-3 and np.abs(chunked - offline).max() <= 1e-6 * peak


def test_missing_input_exits_2_subprocess(ckpt, tmp_path):
    res = run_cli("decode", tmp_path / "nope.npy", "-o", tmp_path / "x.wav", "--codec", ckpt)
    assert res.returncode == 2 and "nope.npy" in res.stderr and "not found" in res.stderr


def test_mono_wav_is_duplicated_and_pcm16_output(ckpt, tmp_path):
    mono = stereo(3 * SPF)[0]
    sf.write(tmp_path / "mono.wav", mono, 48000, subtype="FLOAT")
    np.save(tmp_path / "dup.npy", np.stack([mono, mono]))
    assert main(["encode", str(tmp_path / "mono.wav"), "-o", str(tmp_path / "a.npy"), "--codec", str(ckpt)]) == 0
    assert main(["encode", str(tmp_path / "dup.npy"), "-o", str(tmp_path / "b.npy"), "--codec", str(ckpt),
                 "--n-quantizers", "32"]) == 0
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.shape == (3, 12) and b.shape == (3, 32) and np.array_equal(a, b[:, :12])
    assert main(["decode", str(tmp_path / "a.npy"), "-o", str(tmp_path / "a.wav"), "--codec", str(ckpt),
                 "--wav-subtype", "PCM_16"]) == 0
    info = sf.info(str(tmp_path / "a.wav"))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (48000, 2, 3 * SPF, "PCM_16")


def test_any_rate_is_resampled_like_the_server(ckpt, tmp_path):
    """A 16 kHz mono WAV encodes to the codes of the server's resampled audio (same filter)."""
    from moss_tts.reference.audio import resample

    mono = stereo(SPF)[0]  # one 80 ms frame at 16 kHz is 1280 samples; 3840 samples = 3 frames
    sf.write(tmp_path / "16k.wav", mono, 16000, subtype="FLOAT")
    assert main(["encode", str(tmp_path / "16k.wav"), "-o", str(tmp_path / "c.npy"), "--codec", str(ckpt)]) == 0
    at_48k = resample(torch.from_numpy(mono)[None], 16000, 48000).repeat(2, 1)
    assert at_48k.shape == (2, 3 * SPF)
    expected, _ = load_codec(ckpt).encode(at_48k[None], torch.tensor([3 * SPF]))
    assert np.array_equal(np.load(tmp_path / "c.npy"), expected[0].numpy())


def _error(capsys, argv: list[str]) -> str:
    assert main([str(a) for a in argv]) == 2
    return capsys.readouterr().err


def test_cli_errors(ckpt, tmp_path, capsys):
    codec = ["--codec", ckpt]
    np.save(tmp_path / "audio.npy", stereo(SPF))
    np.save(tmp_path / "three.npy", np.zeros((3, SPF), np.float32))
    np.save(tmp_path / "ok_codes.npy", np.zeros((4, 12), np.int64))
    np.save(tmp_path / "big.npy", np.full((4, 12), 1024, np.int64))
    np.save(tmp_path / "neg.npy", np.full((4, 12), -1, np.int64))
    np.save(tmp_path / "flat.npy", np.zeros(12, np.int64))
    np.save(tmp_path / "float_codes.npy", np.zeros((4, 12), np.float32))
    np.save(tmp_path / "many.npy", np.zeros((4, 33), np.int64))
    out = tmp_path / "out.npy"
    cases = [
        (["encode", tmp_path / "missing.wav", "-o", out, *codec], "not found"),
        (["encode", tmp_path / "three.npy", "-o", out, *codec], "[2, samples]"),
        (["encode", tmp_path / "audio.npy", "-o", out, *codec, "--n-quantizers", "0"], "n_quantizers"),
        (["encode", tmp_path / "audio.npy", "-o", out, *codec, "--n-quantizers", "33"], "n_quantizers"),
        (["encode", tmp_path / "audio.npy", "-o", tmp_path / "c.txt", *codec], "extension"),
        (["encode", tmp_path / "audio.npy", "-o", out, "--codec", tmp_path / "nodir"], "nodir"),
        (["decode", tmp_path / "big.npy", "-o", tmp_path / "x.wav", *codec], "outside [0, 1024)"),
        (["decode", tmp_path / "neg.npy", "-o", tmp_path / "x.wav", *codec], "outside [0, 1024)"),
        (["decode", tmp_path / "flat.npy", "-o", tmp_path / "x.wav", *codec], "[frames, codebooks]"),
        (["decode", tmp_path / "float_codes.npy", "-o", tmp_path / "x.wav", *codec], "integer"),
        (["decode", tmp_path / "many.npy", "-o", tmp_path / "x.wav", *codec], "33 codebooks"),
        (["decode", tmp_path / "ok_codes.npy", "-o", tmp_path / "x.wav", *codec, "--chunk-frames", "-1"],
         "--chunk-frames"),
        (["decode", tmp_path / "ok_codes.npy", "-o", tmp_path / "nodir" / "x.wav", *codec], "does not exist"),
    ]
    for argv, message in cases:
        err = _error(capsys, argv)
        assert err.startswith("error: ") and message in err, (argv, err)
    assert not out.exists()
