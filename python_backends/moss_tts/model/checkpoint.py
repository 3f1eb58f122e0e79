"""Strict safetensors loading shared by the TTS model and the codec.

A checkpoint that does not match the module exactly (missing, unexpected or mis-shaped
tensor) is an error naming the tensor and the file, never a silent partial load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open


class CheckpointError(ValueError):
    """The checkpoint on disk does not match the architecture its config describes."""


def read_safetensors(paths: list[Path], keep=lambda name: True) -> dict[str, torch.Tensor]:
    """Read the tensors of one or more .safetensors shards whose name `keep` accepts into CPU memory
    (the others are never read)."""
    tensors: dict[str, torch.Tensor] = {}
    for path in paths:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                if not keep(name):
                    continue
                if name in tensors:
                    raise CheckpointError(f"{path}: tensor {name!r} appears in more than one shard")
                tensors[name] = handle.get_tensor(name)
    return tensors


def find_safetensors(directory: Path) -> list[Path]:
    paths = sorted(Path(directory).glob("*.safetensors"))
    if not paths:
        raise CheckpointError(f"{directory}: no *.safetensors file found")
    return paths


def load_state_strict(
    module: torch.nn.Module,
    tensors: Mapping[str, torch.Tensor],
    source: str,
    *,
    ignore: frozenset[str] = frozenset(),
) -> None:
    """Copy `tensors` into `module`'s parameters and persistent buffers, all or nothing.

    `ignore` names tensors that the file holds but the module derives another way
    (for example tied copies stored separately); they are checked for shape only.
    """
    expected = module.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected) - set(ignore))
    if missing:
        raise CheckpointError(f"{source}: missing tensor(s) {_preview(missing)}")
    if unexpected:
        raise CheckpointError(f"{source}: unexpected tensor(s) {_preview(unexpected)}")
    for name, target in expected.items():
        if tuple(tensors[name].shape) != tuple(target.shape):
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                f"the config implies {tuple(target.shape)}"
            )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(tensors[name].to(dtype=target.dtype))


def _preview(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    more = len(names) - limit
    return shown + (f" and {more} more" if more > 0 else "")
