"""Static, slot-major KV cache of the backbone: one row of max_seq_len per running request.

Buffers are allocated once in `setup` and written in place; a slot is a request's private
row, handed out and taken back through a free list. Rows past a slot's length hold stale
values of earlier occupants; attention masks them, so a freed slot is never cleared.
"""

from __future__ import annotations

import heapq
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
        # Host upper bound of each slot's KV rows (exact while the slot generates), known without
        # a sync: it picks the attention window of a decode step.
        self.lengths = [0] * num_slots
        # Lowest slot first: running slots stay packed at the front, so a decode step over
        # slots [0, S) wastes few rows.
        self._free = list(range(num_slots))

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
        slot = heapq.heappop(self._free)
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        assert slot not in self._free, f"KV slot {slot} freed twice"
        self.lengths[slot] = 0
        heapq.heappush(self._free, slot)

    def write_range(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Prefill: k/v [1, T, kv_heads, head_dim] at rows [start, start+T) of one slot; returns
        that slot's keys/values [1, start+T, ...] for attention."""
        end = start + k.shape[1]
        self.k[layer][slot, start:end] = k[0]
        self.v[layer][slot, start:end] = v[0]
        return self.k[layer][slot:slot + 1, :end], self.v[layer][slot:slot + 1, :end]

    def write_prompts(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Batched prefill from row 0: k/v [N, T, kv_heads, head_dim] into rows [0, T) of `slots`."""
        t = k.shape[1]
        self.k[layer][:, :t].index_copy_(0, slots, k)
        self.v[layer][:, :t].index_copy_(0, slots, v)

    def write_step(self, layer: int, slot_ids: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> None:
        """Decode: k/v [S, kv_heads, head_dim] at row positions[i] of slot slot_ids[i]."""
        self.k[layer].index_put_((slot_ids, positions), k)
        self.v[layer].index_put_((slot_ids, positions), v)

    def window(self, layer: int, num_slots: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views [S, kv_len, kv_heads, head_dim] of slots [0, S): no copy (rows past a slot's
        length are stale and for the caller to mask)."""
        return self.k[layer][:num_slots, :kv_len], self.v[layer][:num_slots, :kv_len]


def _free_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    free, total = torch.cuda.mem_get_info(device)
    return f"; device memory free {free / 2**30:.1f} / {total / 2**30:.1f} GiB"
