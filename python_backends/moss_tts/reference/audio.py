"""Reference audio preparation: decode, stereo, 48 kHz, loudness as upstream does it.

Upstream resamples with torchaudio's default windowed-sinc (Hann window, 6 zero crossings,
rolloff 0.99); `resample` below implements that same filter in plain torch so the server
needs no torchaudio.
"""

from __future__ import annotations

import io
import math
from functools import lru_cache

import numpy as np
import torch

from ..contract.errors import error_text
from ..contract.tensors import MAX_REFERENCE_SECONDS, SAMPLE_RATE

TARGET_DBFS = -20.0
MAX_GAIN_DB = 3.0


class AudioError(ValueError):
    """Reference audio that cannot be used; the message says why."""


def read_audio(data: bytes | str) -> tuple[np.ndarray, int]:
    """Bytes of a WAV/FLAC/OGG/... file, or a path -> (float32 [channels, samples], rate)."""
    import soundfile as sf

    is_bytes = isinstance(data, (bytes, bytearray, memoryview))
    try:
        samples, rate = sf.read(io.BytesIO(data) if is_bytes else data, dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises several types for undecodable input
        # For bytes its message names the source by repr ("Error opening <_io.BytesIO object at
        # 0x...>: "), which tells the client nothing: keep libsndfile's reason ("Format not recognised.").
        reason = (getattr(exc, "error_string", None) if is_bytes else None) or error_text(exc)
        raise AudioError(f"reference audio could not be decoded ({reason}); send WAV, FLAC or OGG") from None
    return np.ascontiguousarray(samples.T), int(rate)


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int, width_zeros: int = 6, rolloff: float = 0.99):
    base = min(orig, new) * rolloff
    width = math.ceil(width_zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64) / orig
    t = (torch.arange(0, -new, -1, dtype=torch.float64)[:, None] / new + idx[None, :]) * base
    t = t.clamp(-width_zeros, width_zeros)
    window = torch.cos(t * math.pi / width_zeros / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / torch.where(t == 0, torch.ones_like(t), t))
    return (sinc * window * (base / orig)).unsqueeze(1), width


def resample(wav: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """[channels, samples] from `orig` Hz to `new` Hz with a Hann-windowed sinc filter."""
    if orig == new:
        return wav
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    kernel, width = _sinc_kernel(orig, new)
    length = wav.shape[-1]
    x = torch.nn.functional.pad(wav.reshape(-1, 1, length).double(), (width, width + orig))
    y = torch.nn.functional.conv1d(x, kernel, stride=orig).transpose(1, 2).reshape(wav.shape[0], -1)
    return y[:, : math.ceil(new * length / orig)].to(wav.dtype)


def loudness_normalize(wav: torch.Tensor) -> torch.Tensor:
    """Scale toward -20 dBFS (mean power over all channels), gain clamped to +-3 dB."""
    if wav.numel() == 0:
        return wav
    current = 10.0 * torch.log10(torch.mean(wav.float() ** 2) + 1e-9)
    gain = max(-MAX_GAIN_DB, min(float(TARGET_DBFS - current), MAX_GAIN_DB))
    return wav * (10.0 ** (gain / 20.0))


def prepare_reference(samples: np.ndarray | torch.Tensor, rate: int,
                      max_seconds: float = MAX_REFERENCE_SECONDS) -> torch.Tensor:
    """[channels, samples] at any rate -> float32 stereo [2, samples] at 48 kHz, normalised."""
    wav = torch.as_tensor(samples, dtype=torch.float32)
    if wav.ndim == 1:
        wav = wav.unsqueeze(0)
    if wav.ndim != 2 or wav.shape[0] == 0 or wav.shape[1] == 0:
        raise AudioError("reference audio is empty")
    if rate <= 0:
        raise AudioError(f"reference audio has an invalid sample rate {rate}")
    seconds = wav.shape[1] / rate
    if seconds > max_seconds:
        raise AudioError(f"reference audio is {seconds:.1f} s long; the limit is {max_seconds:.0f} s")
    if not torch.isfinite(wav).all():
        raise AudioError("reference audio contains NaN or infinite samples")
    wav = resample(wav, rate, SAMPLE_RATE)
    wav = wav.repeat(2, 1) if wav.shape[0] == 1 else wav[:2]
    return loudness_normalize(wav)


def load_reference(data: bytes | str, max_seconds: float = MAX_REFERENCE_SECONDS) -> torch.Tensor:
    samples, rate = read_audio(data)
    return prepare_reference(samples, rate, max_seconds)
