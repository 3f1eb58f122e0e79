"""PatchedPretransform (a parameter-free reshape) and the stereo interleave, channel-last.

Upstream works in [B, C, T]: patching maps [B, D, L*h] to [B, D*h, L] with output channel
d*h + k taken from time l*h + k. The same index map is applied here on [B, T, C] tensors,
which is what the transformers consume, so no transposes are needed between stages.
"""

from __future__ import annotations

import torch
from torch import nn


class Patch(nn.Module):
    def __init__(self, patch_size: int, downsample: bool):
        super().__init__()
        self.patch_size, self.downsample = patch_size, downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.patch_size
        if self.downsample:  # [B, L*h, D] -> [B, L, D*h]
            return x.reshape(b, t // h, h, d).transpose(2, 3).reshape(b, t // h, d * h)
        return x.reshape(b, t, d // h, h).transpose(2, 3).reshape(b, t * h, d // h)


def interleave(audio: torch.Tensor) -> torch.Tensor:
    """[B, C, S] -> [B, C*S, 1] stream L0 R0 L1 R1 ..."""
    b, c, s = audio.shape
    return audio.transpose(1, 2).reshape(b, c * s, 1)


def deinterleave(stream: torch.Tensor, channels: int) -> torch.Tensor:
    """[B, C*S, 1] -> [B, C, S]."""
    b = stream.shape[0]
    return stream.reshape(b, -1, channels).transpose(1, 2)
