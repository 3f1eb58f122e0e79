"""Offline text-to-speech from the command line (the product's end-to-end check).

  python -m moss_tts.generate --model DIR --text "Hello" --out-wav out.wav [--reference ref.wav]

Writes any of: the prompt rows [T, 13] (.npy), the generated codes [frames, 12] (.npy) and
48 kHz stereo audio (.wav float32). User errors exit with status 2 and a one-line reason.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .contract.sampling_params import (AUDIO_REPETITION_PENALTY, AUDIO_TEMPERATURE, AUDIO_TOP_K, AUDIO_TOP_P,
                                       DEFAULT_MAX_FRAMES, ChannelParams, SamplingError, SamplingParams)
from .model.checkpoint import CheckpointError
from .model.config import ConfigError
from .model.generation import generate
from .model.loading import load_model, load_tokenizer, resolve_codec_dir
from .model.processor import PromptBuilder, PromptError, PromptFields, PromptSpec, parse_tokens, split_token_prefix
from .reference.audio import AudioError, load_reference
from .reference.codes import encode_references

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m moss_tts.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="MOSS-TTS-Local-Transformer-v1.5 directory")
    p.add_argument("--codec", type=Path, help="MOSS-Audio-Tokenizer-v2 directory (default: from the model config)")
    p.add_argument("--text", required=True, help="text to speak; may start with ${token:N}")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--reference", type=Path, help="reference audio file (any rate, mono or stereo, <= 100 s)")
    g.add_argument("--reference-codes", type=Path, help="reference codes .npy [frames, 12]")
    p.add_argument("--reference-text", help="transcript of the reference (used in continuation mode)")
    p.add_argument("--mode", choices=["clone", "continuation"], default="clone")
    p.add_argument("--language")
    p.add_argument("--instructions")
    p.add_argument("--tokens", help="target duration in frames (12.5 per second)")
    p.add_argument("--seed", type=int)
    p.add_argument("--greedy", action="store_true", help="argmax everywhere (may never stop)")
    p.add_argument("--temperature", type=float, default=AUDIO_TEMPERATURE)
    p.add_argument("--top-p", type=float, default=AUDIO_TOP_P)
    p.add_argument("--top-k", type=int, default=AUDIO_TOP_K)
    p.add_argument("--repetition-penalty", type=float, default=AUDIO_REPETITION_PENALTY)
    p.add_argument("--max-frames", type=int, default=DEFAULT_MAX_FRAMES)
    p.add_argument("--ignore-stop", action="store_true", help="generate exactly --max-frames frames")
    p.add_argument("--out-prompt", type=Path)
    p.add_argument("--out-codes", type=Path)
    p.add_argument("--out-wav", type=Path)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    return p.parse_args(argv)


def sampling_params(args) -> SamplingParams:
    common = dict(seed=args.seed, max_frames=args.max_frames, ignore_stop=args.ignore_stop)
    if args.greedy:
        return SamplingParams.greedy(repetition_penalty=args.repetition_penalty, **common)
    audio = ChannelParams(args.temperature, args.top_p, args.top_k, args.repetition_penalty)
    return SamplingParams(audio=audio, **common)


def reference_codes(args, codec) -> torch.Tensor | None:
    if args.reference_codes is not None:
        if not args.reference_codes.is_file():
            raise PromptError(f"{args.reference_codes}: file not found")
        return torch.from_numpy(np.load(args.reference_codes, allow_pickle=False))
    if args.reference is None:
        return None
    if not args.reference.is_file():
        raise AudioError(f"{args.reference}: file not found")
    wav = load_reference(str(args.reference))
    return encode_references(codec, [wav.to(next(codec.parameters()).device)])[0]


def run(args) -> None:
    from .codec.checkpoint import load_codec

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    params = sampling_params(args)
    tokens, text = split_token_prefix(args.text)
    if args.tokens is not None:
        tokens = parse_tokens(args.tokens, "--tokens")
    model = load_model(args.model, device, dtype)
    need_codec = args.reference is not None or args.out_wav is not None
    codec = load_codec(resolve_codec_dir(args.model, args.codec), device) if need_codec else None
    ref = reference_codes(args, codec)
    fields = PromptFields(instruction=args.instructions, tokens=tokens, language=args.language)
    spec = PromptSpec(text, fields, ref, args.reference_text, args.mode)
    rows = PromptBuilder(load_tokenizer(args.model), model.cfg).build(spec)
    if args.out_prompt:
        np.save(args.out_prompt, rows.numpy())
    start = time.perf_counter()
    result = generate(model, [rows], [params])[0]
    elapsed = time.perf_counter() - start
    frames = result.codes.shape[0]
    print(f"generated {frames} frames ({frames / model.cfg.frame_rate:.2f} s of audio) in {elapsed:.2f} s, "
          f"finish: {result.finish_reason}", file=sys.stderr)
    if args.out_codes:
        np.save(args.out_codes, result.codes.numpy())
    if args.out_wav:
        write_wav(args.out_wav, codec, result.codes, ref if args.mode == "continuation" else None)


def write_wav(path: Path, codec, codes: torch.Tensor, prefix: torch.Tensor | None) -> None:
    """Decode to 48 kHz stereo float32 WAV. In continuation mode the reference frames are
    decoded first (they set the codec's causal context) and their audio is cut off."""
    import soundfile as sf

    device = next(codec.parameters()).device
    skip = 0 if prefix is None else prefix.shape[0] * codec.samples_per_frame
    full = codes if prefix is None else torch.cat([prefix.long(), codes])
    audio = codec.decode(full.unsqueeze(0).to(device))[0, :, skip:].float().cpu()
    sf.write(str(path), audio.T.numpy(), codec.sample_rate, subtype="FLOAT")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except (PromptError, AudioError, SamplingError, ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
