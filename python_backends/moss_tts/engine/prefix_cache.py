"""PrefixCache: which blocks of prompt rows already have their keys/values in the prefix pool.

Policy only, no device tensors; the scheduler's CacheManager drives it. Prompts of one speaker
(same reference codes) and one instruction block start with the same rows, and a row's
keys/values depend only on the rows up to it (the backbone is causal, positions start at 0 in
every slot). So the KV of a block of rows is named by a hash chained over every row up to the
block's end: equal names, equal keys/values. A new prompt copies its longest named prefix from
the pool into its slot and prefills only the rest; after a prefill the prompt's full blocks
that are not in the pool yet are copied there, evicting the least recently used.

Eviction eats chains from the tail: a chain's blocks are marked used tail first, head last, so
its head is the most recent of them (a match walks from the head; losing the head would make
the whole chain unreachable). One step's stores never claim a block another prompt of the same
step named, so one pool block is never the target of two copies at once.

Copies are stream-ordered with the prefills, so a block evicted and overwritten in the same step
it was matched in is read before it is written; the map here is always updated first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import xxhash


def block_hashes(rows: torch.Tensor, block_rows: int) -> tuple[bytes, ...]:
    """Chained names of the full `block_rows`-row blocks of `rows` [T, width] (int64). A pure
    function of the prompt: Engine.submit computes it on the caller's thread, so a wave of
    admissions does not hash on the engine's (RequestState.block_names)."""
    data = np.ascontiguousarray(rows.numpy() if rows.device.type == "cpu" else rows.cpu().numpy(), dtype=np.int64)
    names, parent = [], b""
    for start in range(0, data.shape[0] - block_rows + 1, block_rows):
        parent = xxhash.xxh3_128_digest(parent + data[start:start + block_rows].tobytes())
        names.append(parent)
    return tuple(names)


@dataclass(frozen=True)
class BlockNames:
    """A prompt's block names at one block size, worked out where it was submitted (RequestState.create)."""

    block_rows: int
    hashes: tuple[bytes, ...]

    @classmethod
    def of(cls, rows: torch.Tensor, block_rows: int) -> "BlockNames":
        return cls(block_rows, block_hashes(rows, block_rows))


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
        """Chained names of the full blocks of `rows` [T, width] (int64)."""
        return block_hashes(rows, self.block_rows)

    def reusable_rows(self, rows: torch.Tensor, hashes: tuple[bytes, ...]) -> int:
        """Rows of `rows` (named by `hashes`, its block_hashes) that match() would copy from the
        pool now; changes nothing (the scheduler's budget asks before it admits)."""
        return len(self._found(rows, hashes)) * self.block_rows

    def match(self, rows: torch.Tensor, hashes: Optional[tuple[bytes, ...]] = None) -> PrefixMatch:
        """The longest prefix of `rows` in the pool, leaving at least the last row to prefill
        (its hidden state samples the first frame). Marks the matched blocks as used.
        `hashes`: its block_hashes, when the caller already has them."""
        hashes = self.block_hashes(rows) if hashes is None else hashes
        found = self._found(rows, hashes)
        self._touch(hashes[:len(found)])
        self._lookups += 1
        self._prompt_rows += rows.shape[0]
        self._reused_rows += len(found) * self.block_rows
        return PrefixMatch(hashes, tuple(found), self.block_rows)

    def _found(self, rows: torch.Tensor, hashes: tuple[bytes, ...]) -> list[int]:
        usable = (rows.shape[0] - 1) // self.block_rows
        found = []
        for name in hashes[:usable]:
            block = self._blocks.get(name)
            if block is None:
                break
            found.append(block)
        return found

    def store(self, matches: list[PrefixMatch]) -> list[list[tuple[int, int]]]:
        """Claim pool blocks for one step's prompts: per prompt, its full blocks past the reused
        prefix that the pool lacks, as (block index in the prompt, pool block) pairs for the
        caller to copy into. Blocks any of these prompts name are not evicted for another."""
        protected = {name for m in matches for name in m.hashes}
        claims = []
        for match in matches:
            copies = []
            for index in range(len(match.pool_blocks), len(match.hashes)):
                name = match.hashes[index]
                if name in self._blocks:
                    continue
                block = self._claim(name, protected)
                if block is None:
                    break
                copies.append((index, block))
            self._touch(match.hashes)
            self._stored += len(copies)
            claims.append(copies)
        return claims

    def forget(self, named_blocks: Iterable[tuple[bytes, int]]) -> None:
        """Undo `store` for (name, pool block) claims whose copy never happened: their names
        must not point at pool blocks holding something else."""
        for name, block in named_blocks:
            if self._blocks.get(name) == block:
                del self._blocks[name]
                self._free.append(block)

    def _touch(self, chain) -> None:
        """Mark a chain's blocks used, tail first, so its head is the last to be evicted."""
        for name in reversed(chain):
            if name in self._blocks:
                self._blocks.move_to_end(name)

    def _claim(self, name: bytes, protected: set[bytes]):
        """A free block, else the least recently used one whose name is not `protected`. None
        when every block is protected."""
        if self._free:
            block = self._free.pop()
        else:
            victim = next((old for old in self._blocks if old not in protected), None)
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
