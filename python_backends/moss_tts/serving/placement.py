"""Where a Triton model instance runs and which checkpoint it serves (no Triton imports)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..model.checkpoint import CheckpointError
from ..model.loading import resolve_codec_dir

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_device(setting: str, instance_device_id: int) -> torch.device:
    """"auto" = the instance's GPU when CUDA is present, else the CPU; or "cpu"/"cuda"/"cuda:N"."""
    setting = (setting or "auto").strip().lower()
    if setting == "auto":
        return torch.device(f"cuda:{instance_device_id}") if torch.cuda.is_available() else torch.device("cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={setting!r} was configured but CUDA is not available")
    return torch.device(f"cuda:{instance_device_id}" if setting == "cuda" else setting)


def use_device(device: torch.device) -> torch.device:
    """Make `device` the process's current CUDA device and return it.

    A stub serving an instance on cuda:1 still starts with cuda:0 current, and CUDA graph
    capture, Triton kernels and `torch.cuda.Stream()` all use the current device, not the
    tensors' one. Each stub runs one instance, so setting it once in initialize is enough."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def resolve_dtype(setting: str, device: torch.device) -> torch.dtype:
    """"auto" = bfloat16 on GPU, float32 on CPU."""
    setting = (setting or "auto").strip().lower()
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if setting not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(sorted(DTYPES))}; got {setting!r}")
    return DTYPES[setting]


def checkpoint_dirs() -> tuple[Path, Path]:
    """(model dir, codec dir) from MOSS_TTS_MODEL_DIR / MOSS_TTS_CODEC_DIR (set by scripts/serve.sh)."""
    model = os.environ.get("MOSS_TTS_MODEL_DIR", "").strip()
    if not model:
        raise CheckpointError("MOSS_TTS_MODEL_DIR is not set: start the server with `make serve` or set it to "
                              "a MOSS-TTS-Local-Transformer-v1.5 directory")
    codec = os.environ.get("MOSS_TTS_CODEC_DIR", "").strip() or None
    return Path(model), resolve_codec_dir(model, codec)
