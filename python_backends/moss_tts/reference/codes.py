"""Reference audio -> RVQ codes [frames, 12], batched, as the upstream processor does it."""

from __future__ import annotations

import torch

from ..contract.tensors import N_VQ
from .audio import AudioError


@torch.no_grad()
def encode_references(codec, wavs: list[torch.Tensor], n_vq: int = N_VQ) -> list[torch.Tensor]:
    """Prepared stereo 48 kHz references [2, S_i] -> codes [frames_i, n_vq] (int64, CPU).

    Like upstream, a reference keeps only whole frames (floor(S / 3840)): the encoder is
    causal, so those frames do not depend on the padded tail of the last partial frame.
    """
    spf = codec.samples_per_frame
    for wav in wavs:
        if wav.shape[-1] < spf:
            raise AudioError(f"reference audio is shorter than one codec frame ({spf / 48000 * 1000:.0f} ms)")
    p = next(codec.parameters())
    longest = max(w.shape[-1] for w in wavs)
    batch = torch.zeros(len(wavs), 2, longest, device=p.device, dtype=torch.float32)
    for i, wav in enumerate(wavs):
        batch[i, :, :wav.shape[-1]] = wav
    lengths = torch.tensor([w.shape[-1] for w in wavs], device=p.device)
    codes, _ = codec.encode(batch, lengths, n_quantizers=n_vq)
    codes = codes.cpu()
    return [codes[i, : w.shape[-1] // spf].clone() for i, w in enumerate(wavs)]
