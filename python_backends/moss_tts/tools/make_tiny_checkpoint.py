"""Write a tiny MOSS-TTS-Local model dir and codec dir in the real layout, with random weights.

    python -m moss_tts.tools.make_tiny_checkpoint OUT_DIR [--seed 0]

OUT_DIR/model: config.json (real schema, tiny sizes), model.safetensors (real tensor names,
tied copies stored separately as published), processor_config.json, tokenizer files.
OUT_DIR/codec: config.json + model.safetensors of MOSS-Audio-Tokenizer-v2 at tiny width.
The weights are random: the audio is noise. Only shapes, names and numerics are real.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..model.config import MossTTSConfig, real_model_config_dict
from ..model.loading import build_random_model, tied_copies
from .tiny_tokenizer import save_tokenizer

# Bump when the tiny layout changes, so scripts/serve.sh rebuilds a stale demo checkpoint.
TINY_CHECKPOINT_VERSION = "2"


def tiny_model_config_dict() -> dict:
    cfg = real_model_config_dict()
    qwen = dict(cfg["qwen3_config"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=128)
    cfg["qwen3_config"] = qwen
    cfg["language_config"] = dict(qwen)
    cfg["gpt2_config"] = dict(cfg["gpt2_config"], n_embd=64, n_head=4, n_inner=128)
    cfg["audio_tokenizer_name_or_path"] = "../codec"
    return cfg


def write_model_dir(directory: Path, config: dict, seed: int, device: str = "cpu",
                    dtype: torch.dtype = torch.float32, std: float = 0.15) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "processor_config.json").write_text(json.dumps({
        "processor_class": "MossTTSLocalProcessor",
        "audio_tokenizer_name_or_path": config["audio_tokenizer_name_or_path"],
    }, indent=2) + "\n")
    cfg = MossTTSConfig.from_dict(config, str(directory / "config.json"))
    # A wide init (vs 0.02 at 4B scale) so that, at width 64, the context visibly changes
    # the output: tests of batching and seeding would pass vacuously otherwise.
    model = build_random_model(cfg, device, dtype, seed, std=std)
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    # Published checkpoints store the tied heads as separate tensors: write them the same way.
    tensors["text_lm_head.weight"] = tensors["transformer.embed_tokens.weight"].clone()
    for name in tied_copies(cfg):
        if name.startswith("audio_lm_heads."):
            index = name.split(".")[1]
            tensors[name] = tensors[f"audio_embeddings.{index}.weight"].clone()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    save_tokenizer(directory)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real-size", action="store_true",
                        help="the published sizes (Qwen3-4B backbone, 2B codec) in bf16, drawn on a GPU: "
                             "~12 GB on disk, for benchmarks of the served pipeline")
    args = parser.parse_args(argv)
    from ..codec.checkpoint import write_codec_checkpoint
    from ..codec.config import real_codec_config_dict, tiny_codec_config_dict

    if args.real_size:
        # The real init scale (0.02): the tiny one's 0.15 is only there to make width 64 visible.
        config = dict(real_model_config_dict(), audio_tokenizer_name_or_path="../codec")
        write_model_dir(args.out_dir / "model", config, args.seed, "cuda", torch.bfloat16, std=0.02)
        write_codec_checkpoint(args.out_dir / "codec", real_codec_config_dict(), args.seed, "cuda", torch.bfloat16)
    else:
        write_model_dir(args.out_dir / "model", tiny_model_config_dict(), args.seed)
        write_codec_checkpoint(args.out_dir / "codec", tiny_codec_config_dict(), args.seed)
        (args.out_dir / "VERSION").write_text(TINY_CHECKPOINT_VERSION + "\n")
    print(f"wrote {args.out_dir}/model and {args.out_dir}/codec (random weights: output audio is noise)")


if __name__ == "__main__":
    main()
