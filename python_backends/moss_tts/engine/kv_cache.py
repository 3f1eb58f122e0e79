"""Static, slot-major KV cache of the backbone: one row of max_seq_len per running request.

Buffers are allocated once in `setup` and written in place; a slot is a request's private
row, handed out and taken back through a free list. Rows past a slot's length hold stale
values of earlier occupants; attention masks them, so a freed slot is never cleared.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class StaticKVCache:
    def __init__(self, num_layers: int, num_slots: int, max_seq_len: int, kv_heads: int,
                 head_dim: int) -> None:
        self.num_layers, self.num_slots, self.max_seq_len = num_layers, num_slots, max_seq_len
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.k: list[torch.Tensor] = []  # per layer [num_slots, max_seq_len, kv_heads, head_dim]
        self.v: list[torch.Tensor] = []
        self.lengths = [0] * num_slots  # host mirror: valid rows per slot, known without a sync
        # Popped from the end: slot 0 first, so a lightly loaded engine keeps touching the same rows.
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def is_ready(self) -> bool:
        return bool(self.k)

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def num_bytes(self, dtype: torch.dtype) -> int:
        per_layer = self.num_slots * self.max_seq_len * self.kv_heads * self.head_dim
        return 2 * self.num_layers * per_layer * torch.empty((), dtype=dtype).element_size()

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        """Allocate the buffers; a second call with the same device and dtype does nothing."""
        if self.is_ready and self.k[0].device == device and self.k[0].dtype == dtype:
            return
        log.info("KV cache: %d layers x %d slots x %d rows = %.1f MiB (%s, %s)%s", self.num_layers,
                 self.num_slots, self.max_seq_len, self.num_bytes(dtype) / 2**20, dtype, device,
                 _free_memory(device))
        shape = (self.num_slots, self.max_seq_len, self.kv_heads, self.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(self.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(self.num_layers)]
        log.info("KV cache allocated%s", _free_memory(device))

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV slot: the scheduler admitted more than max_running_requests")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        assert slot not in self._free, f"KV slot {slot} freed twice"
        self.lengths[slot] = 0
        self._free.append(slot)

    def write_range(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Prefill: k/v [1, T, kv_heads, head_dim] at rows [start, start+T) of one slot; returns
        that slot's keys/values [1, start+T, ...] for attention."""
        end = start + k.shape[1]
        self.k[layer][slot, start:end] = k[0]
        self.v[layer][slot, start:end] = v[0]
        return self.k[layer][slot:slot + 1, :end], self.v[layer][slot:slot + 1, :end]

    def write_rows(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, kv_len: int):
        """Decode: k/v [B, 1, ...] at each slot's own position; returns keys/values [B, kv_len, ...]
        of those slots (rows past a slot's length are for the caller to mask)."""
        self.k[layer][slots, positions] = k[:, 0]
        self.v[layer][slots, positions] = v[:, 0]
        # Slice first so the gather copies kv_len rows per slot, not max_seq_len.
        return (self.k[layer][:, :kv_len].index_select(0, slots),
                self.v[layer][:, :kv_len].index_select(0, slots))


def _free_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    free, total = torch.cuda.mem_get_info(device)
    return f"; device memory free {free / 2**30:.1f} / {total / 2**30:.1f} GiB"
