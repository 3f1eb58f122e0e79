"""Reference audio preparation: stereo, 48 kHz resampling, loudness, limits."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
import torch

from moss_tts.reference.audio import AudioError, load_reference, loudness_normalize, prepare_reference, resample
from test_error_text import assert_no_object_repr


def test_resample_keeps_a_tone_and_length():
    t = torch.arange(24000) / 24000
    tone = torch.sin(2 * np.pi * 440 * t).unsqueeze(0)
    out = resample(tone, 24000, 48000)
    assert out.shape == (1, 48000)
    ref = torch.sin(2 * np.pi * 440 * torch.arange(48000) / 48000)
    assert (out[0, 200:-200] - ref[200:-200]).abs().max() < 2e-3


def test_mono_becomes_stereo_and_loudness_is_clamped():
    quiet = np.full((1, 48000), 0.001, dtype=np.float32)  # -60 dBFS: gain clamps at +3 dB
    out = prepare_reference(quiet, 48000)
    assert out.shape == (2, 48000)
    assert torch.allclose(out, torch.full_like(out, 0.001 * 10 ** (3 / 20)))
    loud = torch.full((2, 100), 0.1)  # exactly -20 dBFS: unchanged up to rounding
    assert torch.allclose(loudness_normalize(loud), loud, rtol=1e-4)


def test_limits_and_bad_input():
    with pytest.raises(AudioError, match="empty"):
        prepare_reference(np.zeros((1, 0), dtype=np.float32), 16000)
    with pytest.raises(AudioError, match="limit is 100 s"):
        prepare_reference(np.zeros((1, 8000 * 101), dtype=np.float32), 8000)
    with pytest.raises(AudioError, match="could not be decoded") as info:
        load_reference(b"RIFF....garbage")
    assert "(Format not recognised.)" in str(info.value)  # libsndfile's reason, kept
    assert_no_object_repr(str(info.value))
    buf = io.BytesIO()
    sf.write(buf, np.zeros((4800, 3), dtype=np.float32), 48000, format="WAV")
    assert load_reference(buf.getvalue()).shape == (2, 4800)  # >2 channels: first two kept
