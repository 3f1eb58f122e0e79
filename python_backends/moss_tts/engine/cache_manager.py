"""CacheManager: the KV cache's capacity policy, on the host, owned by the Scheduler.

It decides which slot a request gets, keeps the host's view of each slot's KV rows, and through
the PrefixCache decides which pool blocks a prompt loads and which of its blocks a step stores.
It never touches a tensor: the runner receives its decisions (a slot and a PrefixMatch per
staged prompt, a StepPlan per step) and moves the keys/values they name.

A step's stores are claimed only after every prompt of the step was matched (at admission), and
the runner copies them after the step's prefills, so no prompt loads a block that this step
is still to write.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional

import torch

from .prefix_cache import BlockNames, PrefixCache, PrefixMatch, PrefixStats


@dataclass(frozen=True)
class PrefixStore:
    """After the step's prefills, copy prompt block `index` of `slot` into pool block `pool_block`."""

    slot: int
    index: int
    pool_block: int
    name: bytes  # the block's chained hash: unnamed again if the step never launches


@dataclass(frozen=True)
class StepPlan:
    """One step's cache decisions, for the runner to carry out."""

    decode_slots: list[int]  # every slot still generating
    kv_len: int  # key rows the decode reads: its longest slot + the row the step adds (0: no decode)
    stores: tuple[PrefixStore, ...] = ()


class CacheManager:
    def __init__(self, num_slots: int, prefix_blocks: int = 0, prefix_block_rows: int = 16) -> None:
        self.num_slots = num_slots
        # Lowest slot first: running slots stay packed at the front, so a decode step over
        # slots [0, S) wastes few rows.
        self._free = list(range(num_slots))
        # Upper bound of each slot's KV rows (exact while the slot generates), known without a
        # device sync: it picks the key window of a decode step.
        self._lengths = [0] * num_slots
        self.prefix = PrefixCache(prefix_blocks, prefix_block_rows) if prefix_blocks else None

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def prefill_rows(self, prompt_rows: torch.Tensor,
                     names: Optional[BlockNames] = None) -> tuple[int, Optional[tuple[bytes, ...]]]:
        """(rows a prefill of this prompt would compute now, its block hashes for allocate):
        the prompt less the prefix the pool holds. Changes nothing. `names`: the prompt's block
        names when the caller has them (RequestState.block_names); at another block size, or
        None, they are worked out here."""
        if self.prefix is None:
            return prompt_rows.shape[0], None
        if names is not None and names.block_rows == self.prefix.block_rows:
            hashes = names.hashes
        else:
            hashes = self.prefix.block_hashes(prompt_rows)
        return prompt_rows.shape[0] - self.prefix.reusable_rows(prompt_rows, hashes), hashes

    def allocate(self, prompt_rows: torch.Tensor,
                 hashes: Optional[tuple[bytes, ...]] = None) -> tuple[int, Optional[PrefixMatch]]:
        """A slot for a newly admitted prompt [T, 13] (int64, CPU), and the pool blocks holding
        its longest known prefix (None with prefix reuse off). `hashes`: from prefill_rows."""
        if not self._free:
            raise RuntimeError("no free KV slot: the scheduler admitted more than max_running_requests")
        slot = heapq.heappop(self._free)
        self._lengths[slot] = prompt_rows.shape[0]
        return slot, None if self.prefix is None else self.prefix.match(prompt_rows, hashes)

    def free(self, slot: int) -> None:
        assert slot not in self._free, f"KV slot {slot} freed twice"
        self._lengths[slot] = 0
        heapq.heappush(self._free, slot)

    def plan_step(self, prompts: list[tuple[int, Optional[PrefixMatch]]], decode_slots: list[int]) -> StepPlan:
        """Decisions for a step that prefills `prompts` ((slot, match) of each prompt staged
        since the last step) and then decodes `decode_slots`."""
        stores = self._claim_stores(prompts)
        kv_len = max((self._lengths[s] for s in decode_slots), default=-1) + 1
        for slot in decode_slots:
            self._lengths[slot] += 1
        return StepPlan(decode_slots, kv_len, stores)

    def abandon(self, plan: StepPlan) -> None:
        """The step failed to launch: unname the pool blocks it claimed, as they hold nothing.
        (Its requests fail, which frees their slots and so their lengths.)"""
        if self.prefix is not None:
            self.prefix.forget((store.name, store.pool_block) for store in plan.stores)

    def prefix_stats(self) -> Optional[PrefixStats]:
        return None if self.prefix is None else self.prefix.stats()

    def _claim_stores(self, prompts: list[tuple[int, Optional[PrefixMatch]]]) -> tuple[PrefixStore, ...]:
        if self.prefix is None or not prompts:
            return ()
        claims = self.prefix.store([match for _, match in prompts])
        return tuple(PrefixStore(slot, index, block, match.hashes[index])
                     for (slot, match), copies in zip(prompts, claims) for index, block in copies)
