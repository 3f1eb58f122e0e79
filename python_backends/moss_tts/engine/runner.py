"""ModelRunner: owns every tensor of the engine (KV cache, per-slot sampling state, last hidden
states) and runs prefill and batched decode steps. It makes no policy decisions.

A decode step, for the running slots: sample a frame from each slot's last backbone hidden
state, record it, feed it back through the backbone at the slot's own position, keep the new
hidden state. The step's only device->host copy carries the emitted flags and codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..model import MossTTSLocalModel
from ..sampling_params import SamplingParams
from . import backbone
from .config import EngineConfig
from .kv_cache import StaticKVCache
from .slot_sampling import SlotSampling


@dataclass(frozen=True)
class StepOutput:
    """Host copy [B, 1 + n_vq] int64 of one step: column 0 = emitted flag, then the codes."""

    host: torch.Tensor
    ready: Optional["torch.cuda.Event"]

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()

    @property
    def emitted(self) -> list[bool]:
        return [bool(x) for x in self.host[:, 0].tolist()]

    @property
    def codes(self) -> torch.Tensor:
        return self.host[:, 1:]


class ModelRunner:
    def __init__(self, model: MossTTSLocalModel, config: EngineConfig) -> None:
        self.model, self.config = model, config
        self.device = model.local_text_lm_head.weight.device
        self.dtype = model.dtype
        b = model.cfg.backbone
        config.check_model(self.device, self.dtype, b.max_position_embeddings)
        self.kv = StaticKVCache(b.num_hidden_layers, config.max_running_requests, config.max_seq_len,
                                b.num_key_value_heads, b.head_dim)
        self.sampling: Optional[SlotSampling] = None
        self.hidden: Optional[torch.Tensor] = None  # [slots, H]: each slot's last backbone output

    @property
    def is_ready(self) -> bool:
        return self.hidden is not None and self.kv.is_ready

    @property
    def num_free_slots(self) -> int:
        return self.kv.num_free_slots

    def setup(self) -> None:
        """Allocate all device state once; safe to call twice."""
        if self.is_ready:
            return
        cfg, slots = self.model.cfg, self.config.max_running_requests
        self.kv.setup(self.device, self.dtype)
        self.sampling = SlotSampling(slots, cfg.n_vq, cfg.audio_vocab_size, self.device)
        self.hidden = torch.zeros(slots, cfg.hidden_size, device=self.device, dtype=self.dtype)

    def allocate_slot(self) -> int:
        return self.kv.allocate()

    def free_slot(self, slot: int) -> None:
        self.kv.free(slot)

    @torch.inference_mode()
    def prefill(self, slot: int, prompt_rows: torch.Tensor, params: SamplingParams) -> None:
        """Run a new request's prompt [T, 13] into its slot, chunk by chunk."""
        assert self.is_ready, "ModelRunner.setup() must run before prefill"
        rows = prompt_rows.to(self.device, non_blocking=True)
        self.sampling.assign(slot, params)
        step = self.config.prefill_chunk_tokens
        for start in range(0, rows.shape[0], step):
            embeds = self.model.embed_rows(rows[start:start + step].unsqueeze(0)).to(self.dtype)
            hidden = backbone.prefill(self.model.transformer, self.kv, slot, embeds, start)
        self.hidden[slot] = hidden[0]
        self.kv.lengths[slot] = rows.shape[0]

    @torch.inference_mode()
    def decode(self, slots: list[int]) -> StepOutput:
        """One frame for each slot in `slots` (every one of them holds a prefilled request)."""
        assert self.is_ready and slots, "decode needs setup() and at least one slot"
        model = self.model
        positions_host = [self.kv.lengths[s] for s in slots]
        rows, positions = self._upload([slots, positions_host])
        batch = self.sampling.gather(rows)
        is_stop, codes = model.sample_frame(self.hidden.index_select(0, rows), batch,
                                            self.sampling.frame_index.index_select(0, rows))
        emitted = ~(is_stop & ~self.sampling.ignore_stop.index_select(0, rows))
        self.sampling.record(rows, batch, codes, emitted)
        out = self._download(torch.cat([emitted.long().unsqueeze(1), codes], dim=1))
        # Rows that stopped feed back a pad row too: their slot is freed before anyone reads it.
        embeds = model.embed_rows(model.feedback_rows(codes, emitted).unsqueeze(1)).to(self.dtype)
        self.hidden[rows] = backbone.decode(model.transformer, self.kv, rows, positions, embeds,
                                            max(positions_host) + 1)
        for s in slots:
            self.kv.lengths[s] += 1
        return out

    def _upload(self, values: list[list[int]]) -> list[torch.Tensor]:
        host = torch.tensor(values, dtype=torch.long)
        if self.device.type == "cuda":
            # Pinned + non_blocking: a pageable copy would wait for the whole queued stream.
            host = host.pin_memory()
        return list(host.to(self.device, non_blocking=True).unbind(0))

    def _download(self, out: torch.Tensor) -> StepOutput:
        if self.device.type != "cuda":
            return StepOutput(out, None)
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return StepOutput(host, ready)
