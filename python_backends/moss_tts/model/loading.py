"""Load MOSS-TTS-Local-Transformer-v1.5 from a Hugging Face directory as published.

The checkpoint stores the tied copies `text_lm_head.weight` (= embed_tokens, unused at
inference) and `audio_lm_heads.{i}.weight` (= audio_embeddings.{i}) separately; like the
upstream tie, the embedding tables are authoritative and the copies are shape-checked only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .checkpoint import CheckpointError, find_safetensors, load_state_strict, read_safetensors
from .config import MossTTSConfig
from .tts_model import MossTTSLocalModel


def tied_copies(cfg: MossTTSConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors the checkpoint stores but the model derives by tying."""
    copies = {"text_lm_head.weight": (cfg.backbone.vocab_size, cfg.hidden_size)}
    for i in range(cfg.n_vq):
        copies[f"audio_lm_heads.{i}.weight"] = (cfg.audio_vocab_size, cfg.hidden_size)
    return copies


def build_empty_model(cfg: MossTTSConfig, device: str | torch.device, dtype: torch.dtype) -> MossTTSLocalModel:
    """Allocate the model on `device` without spending time on random initialisation."""
    with torch.device("meta"):
        model = MossTTSLocalModel(cfg)
    return model.to_empty(device=device).to(dtype).eval()


def load_model(directory: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> MossTTSLocalModel:
    directory = Path(directory)
    cfg = MossTTSConfig.from_pretrained(directory)
    paths = find_safetensors(directory)
    tensors = read_safetensors(paths)
    source = ", ".join(str(p) for p in paths)
    for name, shape in tied_copies(cfg).items():
        if name in tensors and tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                                  f"the config implies {shape}")
    model = build_empty_model(cfg, device, dtype)
    load_state_strict(model, tensors, source, ignore=frozenset(tied_copies(cfg)))
    return model


def init_random_(model: MossTTSLocalModel, seed: int, std: float = 0.02) -> MossTTSLocalModel:
    """Seeded random weights (normal linears/embeddings, unit norms, zero biases), in place."""
    device = model.local_text_lm_head.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, device=device)
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name or ".ln_" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(std * noise)
    return model


def build_random_model(cfg: MossTTSConfig, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32, seed: int = 0,
                       std: float = 0.02) -> MossTTSLocalModel:
    """Real-size (or any-size) model with seeded random weights and no file, for benchmarks.

    Weights are drawn on the target device in fp32, tensor by tensor, so a 4B model
    builds in seconds on a GPU; the same seed gives the same model on the same device type.
    """
    model = build_empty_model(cfg, device, dtype)
    return init_random_(model, seed, std)


def load_tokenizer(directory: str | Path):
    """The Qwen tokenizer shipped in the model directory; never remote code."""
    from transformers import AutoTokenizer

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # AutoTokenizer warns about our model_type; it is expected
    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{directory}: cannot load the tokenizer ({exc})") from exc


def resolve_codec_dir(model_dir: str | Path, override: str | Path | None = None) -> Path:
    """The codec directory: `override`, else the model config's `audio_tokenizer_name_or_path`
    taken relative to the model directory or as a path. Hub ids are not fetched."""
    if override is not None:
        path = Path(override)
        if not path.is_dir():
            raise CheckpointError(f"codec directory {path} does not exist")
        return path
    name = MossTTSConfig.from_pretrained(model_dir).audio_tokenizer_name_or_path
    for candidate in (Path(model_dir) / name, Path(name)):
        if candidate.is_dir():
            return candidate.resolve()
    raise CheckpointError(
        f"the model config names codec {name!r}, which is not a local directory; download it with "
        f"`hf download OpenMOSS-Team/MOSS-Audio-Tokenizer-v2 --local-dir DIR` and pass --codec DIR")
