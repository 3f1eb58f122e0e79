"""Command line: encode audio to codes and decode codes to audio with a MOSS v2 codec checkpoint.

  python -m moss_tts.codec encode IN.(wav|npy) -o codes.npy --codec DIR [--n-quantizers 12]
  python -m moss_tts.codec decode codes.npy -o OUT.(wav|npy) --codec DIR [--chunk-frames N]

A .wav input may have any sample rate: it is resampled to 48 kHz with the server's filter for
reference audio (moss_tts.reference.audio.resample), mono is duplicated to stereo, and, unlike the server's
reference path, the level is left as it is. Audio .npy files are float32 [2, samples] at 48 kHz;
code .npy files are integers [frames, codebooks]. Every user error exits with status 2 and a
message naming the problem.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from ..model.checkpoint import CheckpointError
from ..reference.audio import resample
from .checkpoint import load_codec
from .codec_model import MossAudioCodec
from .config import CodecConfigError

SAMPLE_RATE = 48000
CHANNELS = 2


class CliError(Exception):
    """A problem with the user's input; reported without a traceback."""


def _existing(path: str, what: str, suffixes: tuple[str, ...]) -> Path:
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise CliError(f"{what} {p}: unsupported extension {p.suffix!r} (expected {', '.join(suffixes)})")
    if not p.is_file():
        raise CliError(f"{what} {p}: file not found")
    return p


def _output(path: str, suffixes: tuple[str, ...]) -> Path:
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise CliError(f"output {p}: unsupported extension {p.suffix!r} (expected {', '.join(suffixes)})")
    if not p.parent.is_dir():
        raise CliError(f"output {p}: directory {p.parent} does not exist")
    return p


def read_audio(path: Path) -> np.ndarray:
    """Audio file (.wav at any rate, or .npy [2, samples] at 48 kHz) -> float32 [2, samples] at 48 kHz."""
    if path.suffix.lower() == ".npy":
        audio = np.load(path, allow_pickle=False)
        if audio.ndim != 2 or audio.shape[0] != CHANNELS or not np.issubdtype(audio.dtype, np.floating):
            raise CliError(f"{path}: expected a float array [2, samples], got {audio.dtype} {audio.shape}")
    else:
        import soundfile as sf

        try:
            data, rate = sf.read(str(path), dtype="float32", always_2d=True)
        except Exception as exc:  # soundfile raises several types for unreadable files
            raise CliError(f"{path}: cannot read WAV ({exc})") from exc
        # Resampled before the channels are mapped, in the order the server's prepare_reference uses.
        audio = resample(torch.from_numpy(np.ascontiguousarray(data.T)), rate, SAMPLE_RATE).numpy()
        # Mono is duplicated to both channels; extra channels beyond stereo are dropped.
        audio = np.repeat(audio, 2, axis=0) if audio.shape[0] == 1 else audio[:CHANNELS]
    if audio.shape[1] == 0:
        raise CliError(f"{path}: no samples")
    if not np.isfinite(audio).all():
        raise CliError(f"{path}: audio contains NaN or infinite samples")
    return np.ascontiguousarray(audio, dtype=np.float32)


def read_codes(path: Path, codec: MossAudioCodec) -> np.ndarray:
    codes = np.load(path, allow_pickle=False)
    if codes.ndim != 2 or not np.issubdtype(codes.dtype, np.integer):
        raise CliError(f"{path}: expected an integer array [frames, codebooks], got {codes.dtype} {codes.shape}")
    frames, books = codes.shape
    if frames == 0:
        raise CliError(f"{path}: no frames")
    if not 1 <= books <= codec.num_quantizers:
        raise CliError(f"{path}: {books} codebooks, the codec supports 1..{codec.num_quantizers}")
    if codes.min() < 0 or codes.max() >= codec.codebook_size:
        raise CliError(f"{path}: codes outside [0, {codec.codebook_size}) (min {codes.min()}, max {codes.max()})")
    return codes.astype(np.int64)


def _load(args) -> MossAudioCodec:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda requested but CUDA is not available")
    if not Path(args.codec).is_dir():
        raise CliError(f"--codec {args.codec}: directory not found")
    return load_codec(args.codec, device=args.device)


def cmd_encode(args) -> None:
    src = _existing(args.input, "input", (".wav", ".npy"))
    dst = _output(args.output, (".npy",))
    audio = read_audio(src)
    codec = _load(args)
    codec.quantizer.check_n_quantizers(args.n_quantizers)
    # Count the zero-padded last frame as real so a partial frame keeps its audio (the codec's
    # default, like upstream, codes only whole frames and pads the rest).
    padded = -(-audio.shape[1] // codec.samples_per_frame) * codec.samples_per_frame
    codes, _ = codec.encode(torch.from_numpy(audio)[None].to(args.device), torch.tensor([padded]),
                            n_quantizers=args.n_quantizers)
    np.save(dst, codes[0].cpu().numpy().astype(np.int64))


def decode_codes(codec: MossAudioCodec, codes: torch.Tensor, chunk_frames: int) -> torch.Tensor:
    """codes [T, n_q] -> audio [2, T*3840]; chunk_frames > 0 streams through decode_step."""
    if chunk_frames <= 0:
        return codec.decode(codes[None])[0]
    state = codec.new_decode_state(1)
    chunks = [codec.decode_step(codes[None, i:i + chunk_frames], state)[0]
              for i in range(0, codes.shape[0], chunk_frames)]
    return torch.cat(chunks, dim=-1)


def cmd_decode(args) -> None:
    src = _existing(args.input, "codes", (".npy",))
    dst = _output(args.output, (".wav", ".npy"))
    if args.chunk_frames < 0:
        raise CliError(f"--chunk-frames must be >= 0, got {args.chunk_frames}")
    codec = _load(args)
    codes = torch.from_numpy(read_codes(src, codec)).to(args.device)
    audio = decode_codes(codec, codes, args.chunk_frames).float().cpu().numpy()
    if dst.suffix.lower() == ".npy":
        np.save(dst, audio.astype(np.float32))
    else:
        import soundfile as sf

        sf.write(str(dst), audio.T, SAMPLE_RATE, subtype=args.wav_subtype)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m moss_tts.codec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    enc = sub.add_parser("encode", help="audio (.wav at any rate, resampled to 48 kHz; or [2, S] .npy at 48 kHz) "
                                           "-> codes .npy [frames, codebooks]")
    enc.add_argument("input")
    enc.add_argument("--n-quantizers", type=int, default=12)
    dec = sub.add_parser("decode", help="codes .npy -> audio .wav or .npy")
    dec.add_argument("input")
    dec.add_argument("--chunk-frames", type=int, default=0, help="N > 0: streaming decode, N frames per step")
    dec.add_argument("--wav-subtype", choices=("FLOAT", "PCM_16"), default="FLOAT")
    for p in (enc, dec):
        p.add_argument("-o", "--output", required=True)
        p.add_argument("--codec", required=True, help="directory with config.json and *.safetensors")
        p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        (cmd_encode if args.command == "encode" else cmd_decode)(args)
    except (CliError, CheckpointError, CodecConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
