"""TensorLRU: least-recently-used map of tensors bounded by entry count and by bytes.

Not thread-safe on purpose: its owner already holds a lock around every lookup and insert
(ReferenceEncoder), and a second lock here would only add a lock-order to get wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

import torch


class TensorLRU:
    def __init__(self, max_entries: int, max_bytes: int):
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"max_entries and max_bytes must be >= 1, got {max_entries}, {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, torch.Tensor] = OrderedDict()  # oldest use first
        self.num_bytes = 0
        self.num_evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable) -> torch.Tensor | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: Hashable, value: torch.Tensor) -> bool:
        """Insert (or refresh) `value`; returns False when it alone exceeds max_bytes (not stored)."""
        size = value.nbytes
        if size > self.max_bytes:
            return False  # storing it would evict everything and still not fit
        old = self._items.pop(key, None)
        if old is not None:
            self.num_bytes -= old.nbytes
        self._items[key] = value
        self.num_bytes += size
        while len(self._items) > self.max_entries or self.num_bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self.num_bytes -= evicted.nbytes
            self.num_evictions += 1
        return True

    def clear(self) -> None:
        self._items.clear()
        self.num_bytes = 0
