"""The scheduler's CacheManager on the CPU: slots, the host's KV lengths and decode windows, and
the prefix blocks a step loads and stores (no tensors: decisions only)."""

from __future__ import annotations

import torch

from moss_tts.engine.cache_manager import CacheManager


def prompt(num_rows: int, value: int = 0) -> torch.Tensor:
    return torch.full((num_rows, 13), value, dtype=torch.long)


def allocate_slots(cache: CacheManager, *num_rows: int) -> list[int]:
    return [cache.allocate(prompt(n))[0] for n in num_rows]


def test_slots_are_handed_out_lowest_first():
    cache = CacheManager(num_slots=4)
    assert allocate_slots(cache, 1, 1, 1) == [0, 1, 2]
    cache.free(1)
    cache.free(0)
    assert allocate_slots(cache, 1, 1, 1) == [0, 1, 3]
    assert cache.num_free_slots == 0


def test_the_decode_window_covers_the_longest_slot_and_its_new_row():
    cache = CacheManager(num_slots=3)
    a, b = allocate_slots(cache, 5, 9)
    assert cache.plan_step([], [a, b]).kv_len == 10
    plan = cache.plan_step([], [a])  # b sits this step out
    assert (plan.decode_slots, plan.kv_len) == ([a], 7)
    assert cache.plan_step([], [a, b]).kv_len == 11
    assert cache.plan_step([], []).kv_len == 0
    cache.free(b)
    assert allocate_slots(cache, 2) == [b] and cache.plan_step([], [b]).kv_len == 3, "a freed slot starts over"


def test_reuse_off_matches_and_stores_nothing():
    cache = CacheManager(num_slots=2)
    slot, match = cache.allocate(prompt(40))
    assert match is None and cache.plan_step([(slot, match)], [slot]).stores == ()
    assert cache.prefix_stats() is None


def test_a_step_stores_its_new_blocks_and_a_later_prompt_loads_them():
    cache = CacheManager(num_slots=2, prefix_blocks=8, prefix_block_rows=4)
    first = cache.allocate(prompt(10))
    stores = cache.plan_step([first], []).stores
    assert [(s.slot, s.index) for s in stores] == [(first[0], 0), (first[0], 1)]
    _, again = cache.allocate(prompt(10))
    assert again.pool_blocks == tuple(s.pool_block for s in stores)


def test_an_abandoned_step_leaves_no_names_behind():
    cache = CacheManager(num_slots=2, prefix_blocks=8, prefix_block_rows=4)
    first = cache.allocate(prompt(10))
    cache.abandon(cache.plan_step([first], []))
    _, again = cache.allocate(prompt(10))
    assert again.pool_blocks == () and cache.prefix_stats().pool_blocks_used == 0


def test_block_names_of_another_block_size_are_worked_out_again():
    """RequestState.create names a prompt's blocks on the caller's thread; names made at another
    block size than the cache's would store a block's KV under a name covering other rows."""
    from moss_tts.engine.prefix_cache import BlockNames

    manager = CacheManager(4, prefix_blocks=8, prefix_block_rows=16)
    rows = torch.arange(20 * 13, dtype=torch.long).reshape(20, 13)
    own = manager.prefix.block_hashes(rows)
    assert manager.prefill_rows(rows, BlockNames.of(rows, 16)) == (20, own)
    wrong = BlockNames.of(rows, 12)  # also one full block of a 20-row prompt, another name
    assert wrong.hashes != own and manager.prefill_rows(rows, wrong) == (20, own)
