"""Static, slot-major KV cache of the backbone: one row of max_seq_len per running request,
plus the prefix pool: blocks of rows whose keys/values later prompts copy instead of computing.

Buffers and copy operations only: buffers are allocated once in `setup` and written in place.
A slot is a request's private row; which request holds which slot, and how many rows, is the
scheduler's CacheManager's business. Rows past a slot's length hold stale values of earlier
occupants; attention masks them, so a freed slot is never cleared. Each of K and V is one
tensor over all layers, so a prefix copy is one gather + one scatter for all 36 layers rather
than one per layer and block. The buffers' dtype is the model's, fp8 or int8 (kernels/kv_format.py,
EngineConfig.kv_cache_dtype). Each buffer holds cache rows as kv_format lays them out (an int8
row carries its heads' scales), so every write here stores `to_rows`'s bytes, every copy moves
whole rows, and byte copies (prefix blocks, batched prefill rows) go through uint8 views, which
any dtype has. k/v (and for int8 k_scale/v_scale) are the views the kernels read.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from ..kernels import block_copy
from ..kernels.kv_format import from_cache, is_fp8, round_trip, row_elements, split_rows, to_rows

log = logging.getLogger(__name__)


class StaticKVCache:
    def __init__(self, num_layers: int, num_slots: int, max_seq_len: int, kv_heads: int,
                 head_dim: int, prefix_blocks: int = 0, prefix_block_rows: int = 16) -> None:
        self.num_layers, self.num_slots, self.max_seq_len = num_layers, num_slots, max_seq_len
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.prefix_blocks, self.prefix_block_rows = prefix_blocks, prefix_block_rows
        # Rows per slot in memory: a whole number of prefix blocks, so a slot's blocks are a
        # plain view (the rows past max_seq_len are never used).
        self.slot_rows = -(-max_seq_len // prefix_block_rows) * prefix_block_rows if prefix_blocks else max_seq_len
        self.k: list[torch.Tensor] = []  # per layer [num_slots, slot_rows, kv_heads, head_dim] (views)
        self.v: list[torch.Tensor] = []
        self.k_scale: list[torch.Tensor | None] = []  # per layer [num_slots, slot_rows, kv_heads] fp32, int8 only
        self.v_scale: list[torch.Tensor | None] = []
        self._k_rows: list[torch.Tensor] = []  # per layer [num_slots, slot_rows, row_elements] (what writes fill)
        self._v_rows: list[torch.Tensor] = []
        self._k_all = self._v_all = None  # [layers, num_slots, slot_rows, row_elements]
        self._pool_k = self._pool_v = None  # [layers, prefix_blocks, block_rows, row_elements]
        # The pool and the slots seen as blocks, K and V each (block_copy.BlockPair), viewed once: per copy
        # a view would be one more torch call, and each call on the engine thread gives up the GIL.
        self._pool_pair = self._slot_pair = None

    @property
    def is_ready(self) -> bool:
        return bool(self.k)

    def num_bytes(self, dtype: torch.dtype) -> int:
        """Slots and prefix pool together."""
        rows = self.num_slots * self.slot_rows + self.prefix_blocks * self.prefix_block_rows
        per_row = 2 * self.num_layers * row_elements(self.kv_heads, self.head_dim, dtype)
        return rows * per_row * torch.empty((), dtype=dtype).element_size()

    @property
    def dtype(self) -> torch.dtype | None:
        """The buffers' dtype (kv_format.cache_dtype), None before setup."""
        return self._k_all.dtype if self._k_all is not None else None

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        """Allocate the buffers in `dtype` (the model's, fp8 or int8: kv_format.cache_dtype); a second
        call with the same device and dtype does nothing."""
        if self.is_ready and self.k[0].device == device and self.k[0].dtype == dtype:
            return
        log.info("KV cache: %d layers x (%d slots x %d rows + %d prefix blocks x %d rows) = %.1f MiB "
                 "(%s, %s)%s", self.num_layers, self.num_slots, self.max_seq_len, self.prefix_blocks,
                 self.prefix_block_rows, self.num_bytes(dtype) / 2**20, dtype, device, _free_memory(device))
        width = row_elements(self.kv_heads, self.head_dim, dtype)
        shape = (self.num_layers, self.num_slots, self.slot_rows, width)
        self._k_all = torch.zeros(shape, device=device, dtype=dtype)
        self._v_all = torch.zeros(shape, device=device, dtype=dtype)
        self._k_rows, self._v_rows = list(self._k_all.unbind(0)), list(self._v_all.unbind(0))
        k = [split_rows(rows, self.kv_heads, self.head_dim) for rows in self._k_rows]
        v = [split_rows(rows, self.kv_heads, self.head_dim) for rows in self._v_rows]
        self.k, self.k_scale = [values for values, _ in k], [scales for _, scales in k]
        self.v, self.v_scale = [values for values, _ in v], [scales for _, scales in v]
        if self.prefix_blocks:
            pool = (self.num_layers, self.prefix_blocks, self.prefix_block_rows, width)
            self._pool_k = torch.zeros(pool, device=device, dtype=dtype)
            self._pool_v = torch.zeros(pool, device=device, dtype=dtype)
        if self.prefix_blocks:
            self._pool_pair = block_copy.BlockPair.of(_bytes(self._pool_k), _bytes(self._pool_v))
            self._slot_pair = block_copy.BlockPair.of(_bytes(self._blocks_of(self._k_all)),
                                                      _bytes(self._blocks_of(self._v_all)))
            if block_copy.is_supported(self._pool_k):  # compiled now, not at a wave's first prefix copy
                zero = torch.zeros(1, dtype=torch.long, device=device)
                block_copy.copy_blocks(self._pool_pair, self._slot_pair, zero, zero)  # zeros onto zeros
        log.info("KV cache allocated%s", _free_memory(device))

    def write_range(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Prefill: k/v [1, T, kv_heads, head_dim] at rows [start, start+T) of one slot; returns
        that slot's keys/values [1, start+T, ...] for attention."""
        end = start + k.shape[1]
        self._k_rows[layer][slot, start:end] = to_rows(k[0], self.dtype)
        self._v_rows[layer][slot, start:end] = to_rows(v[0], self.dtype)
        return self._read(layer, slice(slot, slot + 1), end, k.dtype)

    def write_prompts(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Batched prefill from row 0: k/v [N, T, kv_heads, head_dim] into rows [0, T) of `slots`."""
        t = k.shape[1]
        _bytes(self._k_rows[layer][:, :t]).index_copy_(0, slots, _bytes(to_rows(k, self.dtype)))
        _bytes(self._v_rows[layer][:, :t]).index_copy_(0, slots, _bytes(to_rows(v, self.dtype)))

    def write_step(self, layer: int, slot_ids: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> None:
        """k/v [*I, kv_heads, head_dim] at row positions[i] of slot slot_ids[i] for every index i of
        slot_ids and positions [*I]: a decode step's [S], or a prefill's [N, T] after a prefix."""
        self._k_rows[layer].index_put_((slot_ids, positions), to_rows(k, self.dtype))
        self._v_rows[layer].index_put_((slot_ids, positions), to_rows(v, self.dtype))

    def load_prefix(self, slot_blocks: torch.Tensor, pool_blocks: torch.Tensor) -> None:
        """Copy pool blocks into slots, every layer at once: slot_blocks [n] = slot x
        (max_seq_len / block_rows) + block index in the slot; pool_blocks [n] (device)."""
        for pool, blocks in self._kv_blocks():
            blocks.index_copy_(1, slot_blocks, pool.index_select(1, pool_blocks))

    def store_prefix(self, slot_blocks: torch.Tensor, pool_blocks: torch.Tensor) -> None:
        """The reverse of load_prefix: slot blocks into pool blocks, every layer at once."""
        for pool, blocks in self._kv_blocks():
            pool.index_copy_(1, pool_blocks, blocks.index_select(1, slot_blocks))

    def copy_prefixes(self, count: int, slot_blocks: Optional[torch.Tensor], pool_blocks: Optional[torch.Tensor],
                      into_slots: bool, one_launch: bool = False) -> None:
        """A step's `count` prefix copies, pool blocks into slots (into_slots) or slots into the pool.
        one_launch: all of them, K and V, in one kernel launch (kernels/block_copy.py, no temporary;
        the caller checked it can run here); else load_prefix / store_prefix, COPY_BLOCKS at a time."""
        if not count:
            return
        if one_launch:
            if into_slots:
                block_copy.copy_blocks(self._pool_pair, self._slot_pair, pool_blocks, slot_blocks)
            else:
                block_copy.copy_blocks(self._slot_pair, self._pool_pair, slot_blocks, pool_blocks)
        else:
            in_batches(self.load_prefix if into_slots else self.store_prefix, count, slot_blocks, pool_blocks)

    def slot_block(self, slot: int, index: int) -> int:
        """The flat block number load_prefix/store_prefix take for block `index` of `slot`."""
        return slot * (self.slot_rows // self.prefix_block_rows) + index

    def _kv_blocks(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """(pool, slots as blocks) for K, then for V."""
        return (self._pool_pair.k, self._slot_pair.k), (self._pool_pair.v, self._slot_pair.v)

    def _blocks_of(self, cache: torch.Tensor) -> torch.Tensor:
        return cache.view(self.num_layers, -1, self.prefix_block_rows, cache.shape[-1])

    def scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k_scale, v_scale) of `layer` for the kernels (kv_scales), None unless the cache is int8."""
        k_scale = self.k_scale[layer]
        return None if k_scale is None else (k_scale, self.v_scale[layer])

    def window(self, layer: int, num_slots: int, kv_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [S, kv_len, kv_heads, head_dim] of slots [0, S) in `dtype`: views, no
        copy, unless the cache is fp8 or int8: then widened copies of the whole window (the
        masked-SDPA fallback, attention_kernel=false, only). Rows past a slot's length are stale
        and for the caller to mask."""
        return self._read(layer, slice(0, num_slots), kv_len, dtype)

    def gather(self, layer: int, slots: torch.Tensor, kv_len: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [N, kv_len, kv_heads, head_dim] of slots[n] in `dtype` (copies)."""
        return self._read(layer, slots, kv_len, dtype)

    def _read(self, layer: int, slots, kv_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [0, kv_len) of `slots` (a slice: views where the dtype allows; a tensor: gathered),
        widened to `dtype`."""
        def take(t):
            if t is None:
                return None
            return t[slots, :kv_len] if isinstance(slots, slice) else t[:, :kv_len].index_select(0, slots)
        return (from_cache(take(self.k[layer]), dtype, take(self.k_scale[layer])),
                from_cache(take(self.v[layer]), dtype, take(self.v_scale[layer])))

    def as_stored(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., kv_heads, head_dim] as attention reads it back from this cache (itself unless the
        cache is fp8 or int8): for a torch path that attends to the new keys and values it also wrote."""
        return round_trip(x, self.dtype)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """t seen as uint8 (one byte an element: the same shape) where t is fp8: torch has no CPU
    index_copy_ for fp8, and a byte copy is what a cache copy is (int8 copies as itself)."""
    return t.view(torch.uint8) if is_fp8(t.dtype) else t


def _free_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    free, total = torch.cuda.mem_get_info(device)
    return f"; device memory free {free / 2**30:.1f} / {total / 2**30:.1f} GiB"


# Prefix blocks per pool copy: bounds the gather's temporary (64 blocks of the real model are
# 2 x 75 MB) while keeping the copies to a handful of launches per step.
COPY_BLOCKS = 64


def in_batches(copy, count: int, slot_blocks: Optional[torch.Tensor], pool_blocks: Optional[torch.Tensor]) -> None:
    """copy(slot_blocks, pool_blocks) (load_prefix or store_prefix) over the first `count` blocks,
    COPY_BLOCKS at a time."""
    for start in range(0, count, COPY_BLOCKS):
        copy(slot_blocks[start:start + COPY_BLOCKS], pool_blocks[start:start + COPY_BLOCKS])
