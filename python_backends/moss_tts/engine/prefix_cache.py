"""PrefixCache: which blocks of prompt rows already have their keys/values in the prefix pool.

Policy only, no tensors. Prompts of one speaker (same reference codes) and one instruction
block start with the same rows, and a row's keys/values depend only on the rows up to it (the
backbone is causal, positions start at 0 in every slot). So the KV of a block of rows is named
by a hash chained over every row up to the block's end: equal names, equal keys/values. A new
prompt copies its longest named prefix from the pool into its slot and prefills only the rest;
after a prefill the prompt's full blocks that are not in the pool yet are copied there, evicting
the least recently used.

Copies are stream-ordered with the prefills, so a block evicted and overwritten in the same step
it was matched in is read before it is written; the map here is always updated first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import xxhash


@dataclass(frozen=True)
class PrefixMatch:
    """A prompt's blocks: `hashes` of its full blocks; the first len(pool_blocks) are in the pool."""

    hashes: tuple[bytes, ...]
    pool_blocks: tuple[int, ...]
    block_rows: int

    @property
    def reused_rows(self) -> int:
        return len(self.pool_blocks) * self.block_rows


@dataclass(frozen=True)
class PrefixStats:
    lookups: int  # prompts looked up
    prompt_rows: int  # rows of those prompts
    reused_rows: int  # rows copied from the pool instead of prefilled
    blocks_stored: int
    blocks_evicted: int
    pool_blocks_used: int
    pool_blocks: int


class PrefixCache:
    def __init__(self, num_blocks: int, block_rows: int) -> None:
        if num_blocks < 1 or block_rows < 1:
            raise ValueError(f"PrefixCache needs num_blocks >= 1 and block_rows >= 1, "
                             f"got {num_blocks}, {block_rows}")
        self.num_blocks, self.block_rows = num_blocks, block_rows
        self._blocks: OrderedDict[bytes, int] = OrderedDict()  # hash -> pool block, LRU first
        self._free = list(range(num_blocks - 1, -1, -1))
        self._lookups = self._prompt_rows = self._reused_rows = self._stored = self._evicted = 0

    def block_hashes(self, rows: torch.Tensor) -> tuple[bytes, ...]:
        """Chained names of the full blocks of `rows` [T, width] (int64, CPU)."""
        data = np.ascontiguousarray(rows.numpy(), dtype=np.int64)
        b, names, parent = self.block_rows, [], b""
        for start in range(0, data.shape[0] - b + 1, b):
            parent = xxhash.xxh3_128_digest(parent + data[start:start + b].tobytes())
            names.append(parent)
        return tuple(names)

    def match(self, rows: torch.Tensor) -> PrefixMatch:
        """The longest prefix of `rows` in the pool, leaving at least the last row to prefill
        (its hidden state samples the first frame). Marks the matched blocks as used."""
        hashes = self.block_hashes(rows)
        usable = (rows.shape[0] - 1) // self.block_rows
        found = []
        for name in hashes[:usable]:
            block = self._blocks.get(name)
            if block is None:
                break
            self._blocks.move_to_end(name)
            found.append(block)
        self._lookups += 1
        self._prompt_rows += rows.shape[0]
        self._reused_rows += len(found) * self.block_rows
        return PrefixMatch(hashes, tuple(found), self.block_rows)

    def store(self, match: PrefixMatch) -> list[tuple[int, int]]:
        """Claim pool blocks for the prompt's full blocks past its reused prefix that the pool
        lacks: (block index in the prompt, pool block) pairs for the caller to copy into."""
        copies, chain = [], set(match.hashes)
        for index in range(len(match.pool_blocks), len(match.hashes)):
            name = match.hashes[index]
            if name in self._blocks:
                self._blocks.move_to_end(name)
                continue
            block = self._claim(name, chain)
            if block is None:
                break
            copies.append((index, block))
        self._stored += len(copies)
        return copies

    def _claim(self, name: bytes, chain: set[bytes]):
        """A free block, else the least recently used one outside `chain`: evicting the chain's
        own head would leave its tail unreachable (a match walks from the first block). None
        when the whole pool holds this chain."""
        if self._free:
            block = self._free.pop()
        else:
            victim = next((old for old in self._blocks if old not in chain), None)
            if victim is None:
                return None
            block = self._blocks.pop(victim)
            self._evicted += 1
        self._blocks[name] = block
        return block

    def clear(self) -> None:
        self._blocks.clear()
        self._free = list(range(self.num_blocks - 1, -1, -1))

    def stats(self) -> PrefixStats:
        return PrefixStats(self._lookups, self._prompt_rows, self._reused_rows, self._stored,
                           self._evicted, len(self._blocks), self.num_blocks)
