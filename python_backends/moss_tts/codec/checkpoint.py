"""Building, loading and writing codec checkpoints (real tensor names, strict).

Modules are built on the meta device and materialised with `to_empty`, so a real-size load
(2.1 B parameters) never spends time on random initialisation. The quantizer stays fp32
whatever dtype the transformer stages get.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import save_file
from torch import nn

from ..model.checkpoint import find_safetensors, load_state_strict, read_safetensors
from .codec_model import MossAudioCodec
from .config import CodecConfig, real_codec_config_dict

PARTS = ("encoder", "quantizer", "decoder")


def build_codec(config: CodecConfig, device: torch.device | str = "meta",
                dtype: torch.dtype = torch.float32, parts: tuple[str, ...] = PARTS) -> MossAudioCodec:
    """An uninitialised codec (parameters hold garbage unless device is 'meta'), with only `parts`:
    the encoder and decoder are each ~half of the 2 B parameters, and ref_encoder needs only
    encoder + quantizer, the vocoder only quantizer + decoder."""
    unknown = set(parts) - set(PARTS)
    if unknown or "quantizer" not in parts:
        raise ValueError(f"codec parts must include 'quantizer' and come from {PARTS}, got {parts}")
    with torch.device("meta"):
        model = MossAudioCodec(config)
    for name in ("encoder", "decoder"):
        if name not in parts:
            setattr(model, name, nn.ModuleList())  # encode() / decode() then say it was not loaded
    model.to(dtype=dtype)
    model.quantizer.float()
    if torch.device(device).type != "meta":
        model.to_empty(device=device)
    return model.eval().requires_grad_(False)


def load_codec(directory: str | Path, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, parts: tuple[str, ...] = PARTS) -> MossAudioCodec:
    """Load config.json + *.safetensors from `directory` (only the tensors of `parts`); any
    mismatch raises CheckpointError."""
    directory = Path(directory)
    model = build_codec(CodecConfig.from_pretrained(directory), device, dtype, parts)
    paths = find_safetensors(directory)
    skipped = set(PARTS) - set(parts)  # anything else, unknown names too, still meets the strict check
    tensors = read_safetensors(paths, keep=lambda name: name.split(".", 1)[0] not in skipped)
    load_state_strict(model, tensors, ", ".join(str(p) for p in paths))
    return model


def init_random_(model: MossAudioCodec, seed: int) -> MossAudioCodec:
    """Seeded random weights that keep activations finite and non-trivial (for tests/benchmarks)."""
    device = next(model.parameters()).device
    # Noise is drawn on the parameters' device: staging 2.1 B values on the CPU would be slow.
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.state_dict().items()):
            param.copy_(_random_like(name, tuple(param.shape), gen, device))
        # Bring the waveform to roughly +-1 (PCM-16 friendly) with a purely final linear scale.
        last = [m for m in model.decoder if hasattr(m, "output_proj")][-1]
        last.output_proj.weight.mul_(0.2)
    return model


def _random_like(name: str, shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen, device=device)
    if name.endswith(".scale"):  # LayerScale: small, so each layer is a gentle residual update
        return 0.05 + 0.01 * noise
    if ".norm" in name:
        return 1.0 + 0.05 * noise if name.endswith("weight") else 0.05 * noise
    if name.endswith("original0"):  # weight-norm g: row norm of the effective weight
        return 1.0 + 0.1 * noise.abs()
    if name.endswith(".bias"):
        return 0.01 * noise
    if name.endswith("codebook.weight") or name.endswith("original1"):
        return noise
    # Stage outputs shrink a little so the stack does not blow up; the residual stream must
    # stay large next to LayerScale'd branches or fp32 streaming/offline noise is amplified.
    gain = 0.7 if name.endswith("output_proj.weight") else 1.0
    return gain * noise / math.sqrt(shape[-1])  # Linear [out, in]


def build_real_size_codec(device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
                          seed: int = 0) -> MossAudioCodec:
    """Real-size v2 codec with random weights (benchmarks). On 'meta' only the shapes exist."""
    model = build_codec(CodecConfig.from_dict(real_codec_config_dict(), "real_codec_config_dict()"), device, dtype)
    return model if torch.device(device).type == "meta" else init_random_(model, seed)


def write_codec_checkpoint(directory: str | Path, config_dict: Mapping[str, Any], seed: int,
                           device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Path:
    """Write config.json and model.safetensors (seeded random weights, real names and layout);
    the weights are drawn on `device` and stored in `dtype` (a real-size codec: cuda, bf16)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = CodecConfig.from_dict(config_dict, f"{directory}/config.json")
    (directory / "config.json").write_text(json.dumps(dict(config_dict), indent=2), encoding="utf-8")
    model = init_random_(build_codec(config, device, dtype), seed)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    return directory
