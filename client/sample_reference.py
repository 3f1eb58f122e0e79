"""Write a short synthetic, speech-like WAV to try voice cloning with when no recording is at hand.

  python -m client.sample_reference ref.wav [--seconds 4] [--rate 24000]

It is synthetic, not a person: a buzzy voice from a glottal-like source (110-140 Hz, falling over
each phrase) shaped by moving vowel formants, four syllables a second, with noise bursts as
consonants and a pause between two phrases. It says no words, so it has no transcript. It
exercises the whole reference path (decode, resampling, loudness, codec) and sounds voice-like to
the codec; a real checkpoint will clone a robotic voice from it. To clone a real voice, record
5-15 s of one speaker in a quiet room (wav/flac/ogg, any sample rate) and pass that file instead.
The output is deterministic, mono, 16-bit, at --rate Hz.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

SYLLABLES_PER_SECOND = 4.0
EDGE_SILENCE_S = 0.15  # before the first and after the last phrase
PAUSE_S = 0.3  # between the two phrases
HARMONIC_LIMIT_HZ = 5000.0  # voiced energy above this is left out (and always below Nyquist)
VOWEL_FORMANTS_HZ = np.array([  # F1, F2, F3 of a, i, u, e, o (adult male averages)
    [730, 1090, 2440], [270, 2290, 3010], [300, 870, 2240], [530, 1840, 2480], [570, 840, 2410]], np.float64)
FORMANT_BANDWIDTHS_HZ = np.array([90.0, 110.0, 140.0])


def _smooth(x: np.ndarray, width: int) -> np.ndarray:
    """Moving average over `width` samples (same length), so targets glide instead of jumping."""
    padded = np.concatenate([np.full(width, x[0]), x, np.full(width, x[-1])])
    csum = np.cumsum(padded)
    return ((csum[width:] - csum[:-width]) / width)[width // 2: width // 2 + len(x)]


def _plan(num_samples: int, rate: int, rng: np.random.Generator):
    """Per-sample voicing gate, frication gate, formants [3, n] and f0 (Hz)."""
    voiced, noisy = np.zeros(num_samples), np.zeros(num_samples)
    formants = np.empty((3, num_samples))
    f0 = np.empty(num_samples)
    edge, pause = int(EDGE_SILENCE_S * rate), int(PAUSE_S * rate)
    half = (num_samples - 2 * edge - pause) // 2
    syllable = int(rate / SYLLABLES_PER_SECOND)
    formants[:] = VOWEL_FORMANTS_HZ[0][:, None]
    f0[:] = 120.0
    for start in (edge, edge + half + pause):
        end = start + half
        f0[start:end] = np.linspace(140.0, 105.0, half)  # declination over the phrase
        for s in range(start, end - syllable // 2, syllable):
            e = min(s + syllable, end)
            consonant = int(0.06 * rate) if rng.random() < 0.6 else 0
            noisy[s:s + consonant] = 1.0
            voiced[s + consonant:e - int(0.03 * rate)] = 1.0
            formants[:, s:e] = VOWEL_FORMANTS_HZ[rng.integers(len(VOWEL_FORMANTS_HZ))][:, None]
            f0[s:e] *= 1.0 + 0.08 * rng.random()  # a little accent on some syllables
    width = max(1, int(0.03 * rate))
    return (_smooth(voiced, width), _smooth(noisy, width // 3 + 1),
            np.stack([_smooth(f, width) for f in formants]), _smooth(f0, 4 * width))


def _voice(f0: np.ndarray, formants: np.ndarray, rate: int) -> np.ndarray:
    """Harmonics of f0 with a -6 dB/octave tilt, weighted by the formant resonances."""
    phase = 2 * np.pi * np.cumsum(f0) / rate
    limit = min(HARMONIC_LIMIT_HZ, 0.45 * rate)
    out = np.zeros_like(f0)
    for k in range(1, int(limit / f0.min()) + 1):
        freq = k * f0
        peaks = 1.0 / (1.0 + ((freq[None] - formants) / FORMANT_BANDWIDTHS_HZ[:, None]) ** 2)
        out += np.where(freq < limit, (0.02 + peaks.sum(axis=0)) / k, 0.0) * np.sin(k * phase)
    return out


def synthesize(seconds: float, rate: int) -> np.ndarray:
    """Mono float32 [samples] at `rate` Hz, peak 0.5; the same every call."""
    rng = np.random.default_rng(0)
    num_samples = int(seconds * rate)
    voiced, noisy, formants, f0 = _plan(num_samples, rate, rng)
    tremor = 1.0 + 0.1 * np.sin(2 * np.pi * 5.0 * np.arange(num_samples) / rate)  # 5 Hz, as a voice wavers
    voice = _voice(f0, formants, rate) * voiced * tremor
    hiss = np.diff(rng.standard_normal(num_samples + 1)) * noisy  # first difference: a high-passed noise
    audio = voice / np.abs(voice).max() + 0.15 * hiss
    return (0.5 * audio / np.abs(audio).max()).astype(np.float32)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m client.sample_reference", description=__doc__.split("\n\n")[0])
    p.add_argument("output", type=Path, help="the .wav (or .flac) to write")
    p.add_argument("--seconds", type=float, default=4.0, help="length, 2 to 100 s (the server's limit)")
    p.add_argument("--rate", type=int, default=24000, help="sample rate in Hz, 16000 to 48000; the server resamples any")
    return p.parse_args(argv)


def _problem(args) -> str | None:
    if args.output.suffix.lower() not in (".wav", ".flac"):
        return f"{args.output}: write a .wav or .flac"
    if not args.output.parent.is_dir():
        return f"{args.output}: directory {args.output.parent} does not exist"
    if not 2 <= args.seconds <= 100:
        return f"--seconds {args.seconds}: must be 2 to 100"
    if not 16000 <= args.rate <= 48000:
        return f"--rate {args.rate}: must be 16000 to 48000"
    return None


def main(argv=None) -> int:
    import soundfile as sf

    args = parse_args(argv)
    problem = _problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    sf.write(str(args.output), synthesize(args.seconds, args.rate), args.rate, subtype="PCM_16")
    print(f"wrote {args.output}: {args.seconds:g} s of SYNTHETIC speech-like audio (no words, not a real voice), "
          f"{args.rate} Hz mono")
    return 0

if __name__ == "__main__":
    sys.exit(main())
