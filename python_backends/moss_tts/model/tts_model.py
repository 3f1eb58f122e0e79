"""MOSS-TTS-Local-Transformer-v1.5: 13-channel input embedding, Qwen3 backbone, local frame sampler.

One frame = one backbone step + one local pass: position 0 of the local transformer turns
the backbone's last hidden state into both the 2-way stop decision and codebook 0; each
following position feeds back the embedding of the previous code. Codebook heads are the
audio embedding tables themselves (tied in the checkpoint).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import MossTTSConfig
from .local_transformer import LocalTransformer
from .qwen3 import Qwen3Backbone
from .sampler import FrameSampling, apply_repetition_penalty, sample

STOP_INDEX = 1  # local_text_lm_head row 1 = audio_end (stop), row 0 = assistant slot (continue)


class MossTTSLocalModel(nn.Module):
    def __init__(self, cfg: MossTTSConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = Qwen3Backbone(cfg.backbone)
        self.local_transformer = LocalTransformer(cfg.local)
        self.audio_embeddings = nn.ModuleList(
            nn.Embedding(cfg.audio_vocab_size, cfg.hidden_size) for _ in range(cfg.n_vq))
        self.local_text_lm_head = nn.Linear(cfg.hidden_size, 2, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.local_text_lm_head.weight.dtype

    def embed_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [..., 13] -> embeddings [..., H]: text embedding + sum of the non-pad codes.

        Summed channel by channel in order, and pad codes contribute an exact zero.
        """
        x = self.transformer.embed_tokens(rows[..., 0])
        pad = self.cfg.audio_pad_code
        for c, table in enumerate(self.audio_embeddings):
            codes = rows[..., c + 1]
            valid = codes.ne(pad)
            x = x + table(codes.masked_fill(~valid, 0)) * valid.unsqueeze(-1)
        return x

    def stop_logits(self, local_hidden: torch.Tensor) -> torch.Tensor:
        return self.local_text_lm_head(local_hidden)

    def code_logits(self, local_hidden: torch.Tensor, channel: int) -> torch.Tensor:
        return F.linear(local_hidden, self.audio_embeddings[channel].weight)

    def sample_frame(self, hidden: torch.Tensor, state: FrameSampling, step: torch.Tensor):
        """Backbone hidden [B, H] -> (is_stop [B] bool, codes [B, n_vq]) for frame index `step` [B].

        Counter positions: step*13 for the stop head, step*13 + c + 1 for codebook c.
        """
        n_vq = self.cfg.n_vq
        caches = self.local_transformer.new_caches(hidden.shape[0], n_vq + 1, hidden.device, self.dtype)
        base = step * (n_vq + 1)
        u = self.local_transformer.step(hidden.to(self.dtype), caches, 0)
        is_stop = sample(self.stop_logits(u), state.stop, state.seed, base).eq(STOP_INDEX)
        codes = []
        for c in range(n_vq):
            if c > 0:
                u = self.local_transformer.step(self.audio_embeddings[c - 1](codes[-1]).to(self.dtype), caches, c)
            logits = apply_repetition_penalty(self.code_logits(u, c).float(), state.seen[:, c],
                                              state.audio.repetition_penalty)
            codes.append(sample(logits, state.audio, state.seed, base + c + 1))
        return is_stop, torch.stack(codes, dim=-1)

    def feedback_rows(self, codes: torch.Tensor, emitted: torch.Tensor) -> torch.Tensor:
        """Next backbone input rows [B, 13]: [assistant_slot, codes] for rows that emitted a
        frame, [pad, 1024 x 12] (attention-masked by the caller) for rows that did not."""
        cfg = self.cfg
        rows = torch.full((codes.shape[0], cfg.row_width), cfg.audio_pad_code, dtype=torch.long,
                          device=codes.device)
        rows[:, 0] = torch.where(emitted, cfg.audio_assistant_slot_token_id, cfg.pad_token_id)
        rows[:, 1:] = torch.where(emitted.unsqueeze(-1), codes, cfg.audio_pad_code)
        return rows
