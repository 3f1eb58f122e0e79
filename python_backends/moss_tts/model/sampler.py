"""Batched, seeded sampling with per-row parameters and no host-device sync.

Randomness is counter-based: the Gumbel noise for (row seed, position, token id) is a
murmur3-style hash of those three numbers, so a seeded request samples the same tokens
whatever else shares its batch, and nothing reads a global RNG. Every branch on a
parameter is a tensor `where`, so the whole frame can later be captured in a CUDA graph.

The reference loop (model.sample_frame) and the engine's fused path (kernels/fused.py, which
compiles temperature_scores and draw) run these same functions, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass

import torch
import torch.nn.functional as F

from ..contract.sampling_options import SAMPLING_OPTIONS
from ..contract.sampling_params import ChannelParams, SamplingParams

_M32 = 0xFFFFFFFF


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for 0 <= a < 2**32 without overflowing int64."""
    lo, hi = c & 0xFFFF, c >> 16
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & _M32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mul32(_rotl32(_mul32(k & _M32, 0xCC9E2D51), 15), 0x1B873593)
    h = _rotl32(h ^ k, 13)
    return (_mul32(h, 5) + 0xE6546B64) & _M32


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = _mul32(h ^ (h >> 16), 0x85EBCA6B)
    h = _mul32(h ^ (h >> 13), 0xC2B2AE35)
    return h ^ (h >> 16)


def counter_hash(seed: torch.Tensor, position: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """uint32 hash (held in int64) of seed [B], position [B] and token ids [B, V]."""
    h = _mix(torch.zeros_like(seed), seed)
    h = _mix(h, position)
    h = _mix(h.unsqueeze(-1).expand_as(token), token)
    return _fmix(h ^ 12)


def gumbel_noise(seed: torch.Tensor, position: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    # (h + 0.5) / 2**32 lies strictly inside (0, 1), so both logs stay finite.
    u = (counter_hash(seed, position, token).double() + 0.5) / 4294967296.0
    return -torch.log(-torch.log(u))


def _build(cls, params: list[ChannelParams], device) -> "ChannelTensors":
    return cls(**{o.name: torch.tensor([getattr(p, o.name) for p in params],
                                       dtype=torch.float32 if o.kind is float else torch.long, device=device)
                  for o in SAMPLING_OPTIONS})


# One channel group's parameters as per-row tensors [B] on the sampling device: a field per
# declared option (sampling_options.py), float32 or int64. build(params, device) from ChannelParams.
ChannelTensors = make_dataclass("ChannelTensors", [(o.name, torch.Tensor) for o in SAMPLING_OPTIONS],
                                namespace={"__module__": __name__, "build": classmethod(_build)})


@dataclass
class FrameSampling:
    """Per-row sampling state for a batch: parameters, seeds and each channel's code history."""

    stop: ChannelTensors
    audio: ChannelTensors
    seed: torch.Tensor  # [B] int64 row seeds
    seen: torch.Tensor  # [B, n_vq, audio_vocab] bool: codes generated so far, per channel

    @classmethod
    def build(cls, params: list[SamplingParams], n_vq: int, vocab: int, device) -> "FrameSampling":
        return cls(
            stop=ChannelTensors.build([p.stop for p in params], device),
            audio=ChannelTensors.build([p.audio for p in params], device),
            seed=torch.tensor([p.row_seed for p in params], dtype=torch.long, device=device),
            seen=torch.zeros(len(params), n_vq, vocab, dtype=torch.bool, device=device),
        )

    def record(self, codes: torch.Tensor, emitted: torch.Tensor) -> None:
        """Add an emitted frame's codes [B, n_vq] to the history of the rows in `emitted` [B]."""
        hit = F.one_hot(codes, self.seen.shape[-1]).bool() & emitted[:, None, None]
        self.seen |= hit


def apply_repetition_penalty(scores: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Upstream rule over the codes already generated on this channel: shrink positive logits,
    grow negative ones. `seen` [B, V] bool; penalty [B] (1.0 = off, exactly a no-op)."""
    p = penalty.unsqueeze(-1)
    return torch.where(seen, torch.where(scores < 0, scores * p, scores / p), scores)


def temperature_scores(logits: torch.Tensor, temperature: torch.Tensor):
    """logits [B, V] -> (float scores, scores / temperature, is_greedy [B]); temperature 0 means
    argmax, so those rows divide by 1 to keep the scaled scores finite."""
    scores = logits.float()
    is_greedy = temperature == 0
    temp = torch.where(is_greedy, torch.ones_like(temperature), temperature)
    return scores, scores / temp.unsqueeze(-1), is_greedy


def draw(sorted_scores: torch.Tensor, sorted_ids: torch.Tensor, scores: torch.Tensor, is_greedy: torch.Tensor,
         top_k: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Token ids [B] from temperature-scaled scores sorted descending (with their ids): top-k,
    top-p (cumulative softmax, the first token always kept), then a Gumbel-max draw at counter
    `position` [B]; argmax of the unscaled `scores` where greedy. No slice assignment, so
    torch.compile fuses it whole, the noise hash into the draw (kernels/fused.py)."""
    vocab = sorted_scores.shape[-1]
    k = torch.where((top_k <= 0) | (top_k > vocab), torch.full_like(top_k, vocab), top_k)
    kth = sorted_scores.gather(-1, (k - 1).unsqueeze(-1))
    # `<` keeps ties with the k-th score, exactly as upstream's masked_fill(scores < kth).
    sorted_scores = sorted_scores.masked_fill(sorted_scores < kth, float("-inf"))
    cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
    beyond_p = cumulative > top_p.unsqueeze(-1)
    remove = torch.cat([torch.zeros_like(beyond_p[:, :1]), beyond_p[:, :-1]], dim=1)
    remove &= (top_p < 1.0).unsqueeze(-1)
    sorted_scores = sorted_scores.masked_fill(remove, float("-inf"))
    perturbed = sorted_scores.double() + gumbel_noise(seed, position, sorted_ids)
    drawn = sorted_ids.gather(-1, perturbed.argmax(dim=-1, keepdim=True)).squeeze(-1)
    return torch.where(is_greedy, scores.argmax(dim=-1), drawn)


def sample(logits: torch.Tensor, params: ChannelTensors, seed: torch.Tensor,
           position: torch.Tensor) -> torch.Tensor:
    """logits [B, V] (penalty already applied) -> token ids [B].

    Order as upstream: temperature, top-k, top-p, then the draw; temperature 0 means argmax.
    """
    scores, scaled, is_greedy = temperature_scores(logits, params.temperature)
    # Stable: equal scores (common in bf16) keep the lower token id first, so which of them
    # top-p keeps is defined, the same on every device and in the engine's Triton draw.
    sorted_scores, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    return draw(sorted_scores, sorted_ids, scores, is_greedy, params.top_k, params.top_p, seed, position)
