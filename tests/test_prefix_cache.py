"""Prefix reuse: the pool's bookkeeping (PrefixCache), and an engine that copies shared prompt
prefixes from the pool producing exactly the codes of the reference loop. CPU, tiny checkpoint."""

from __future__ import annotations

import pytest
import torch

from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine import Engine, EngineConfig, EngineConfigError, EngineRequest
from moss_tts.engine.kv_cache import StaticKVCache
from moss_tts.engine.prefix_cache import PrefixCache
from moss_tts.model.generation import generate
from moss_tts.model.processor import PromptFields, PromptSpec

from engine_events import TIMEOUT_S, Collector, assert_matches_reference


def rows_of(values: list[int], width: int = 13) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).unsqueeze(1).expand(len(values), width).contiguous()


# ---- PrefixCache (host bookkeeping) ----

def test_block_names_are_chained_over_every_earlier_row():
    cache = PrefixCache(num_blocks=8, block_rows=4)
    a = cache.block_hashes(rows_of(list(range(10))))
    assert len(a) == 2  # full blocks only: rows [0, 4) and [4, 8)
    b = cache.block_hashes(rows_of([99] + list(range(1, 10))))
    assert a[1] != b[1], "a block's name must depend on the rows before it, not only its own"
    c = cache.block_hashes(rows_of(list(range(8)) + [50, 51, 52, 53]))
    assert c[:2] == a and len(c) == 3
    d = rows_of(list(range(8)))
    d[5, 7] = 1000  # one audio code of one row
    assert cache.block_hashes(d)[1] != a[1] and cache.block_hashes(d)[0] == a[0]


def test_match_takes_the_longest_stored_prefix_and_leaves_the_last_row():
    cache = PrefixCache(num_blocks=8, block_rows=4)
    first = cache.match(rows_of(list(range(12))))
    assert first.pool_blocks == () and first.reused_rows == 0 and len(first.hashes) == 3
    [stored] = cache.store([first])
    assert [i for i, _ in stored] == [0, 1, 2]
    assert len({block for _, block in stored}) == 3
    # Same 12 rows again: at most 2 blocks, the 12th row must still be prefilled.
    again = cache.match(rows_of(list(range(12))))
    assert again.reused_rows == 8 and again.pool_blocks == tuple(b for _, b in stored[:2])
    assert cache.store([again]) == [[]]  # its third block is in the pool already
    longer = cache.match(rows_of(list(range(12)) + [7, 7, 7]))
    assert longer.reused_rows == 12
    diverging = cache.match(rows_of([0, 1, 2, 3, 4, 5, 60, 61, 62, 63, 64]))
    assert diverging.reused_rows == 4
    short = cache.match(rows_of([0, 1, 2, 3]))
    assert short.reused_rows == 0, "a prompt of exactly one block keeps that block to prefill"
    stats = cache.stats()
    assert (stats.lookups, stats.reused_rows, stats.blocks_stored, stats.pool_blocks_used) == (5, 24, 3, 3)


def test_a_prompt_never_evicts_the_head_of_its_own_chain():
    cache = PrefixCache(num_blocks=2, block_rows=2)
    long = cache.match(rows_of(list(range(9))))
    assert [i for i, _ in cache.store([long])[0]] == [0, 1]  # 4 full blocks, room for the first 2
    assert cache.match(rows_of(list(range(9)))).reused_rows == 4
    assert cache.stats().blocks_evicted == 0


def test_a_full_pool_evicts_the_least_recently_used_block():
    cache = PrefixCache(num_blocks=3, block_rows=2)
    a = cache.match(rows_of([1, 1, 1, 1, 1]))
    cache.store([a])  # 2 blocks of a
    b = cache.match(rows_of([2, 2, 2]))
    cache.store([b])  # 1 block of b: the pool is full
    assert cache.match(rows_of([1, 1, 1, 1, 1])).reused_rows == 4  # a is now more recent than b
    c = cache.match(rows_of([3, 3, 3]))
    [claimed] = cache.store([c])
    assert len(claimed) == 1 and cache.stats().blocks_evicted == 1
    assert cache.match(rows_of([2, 2, 2])).reused_rows == 0, "b was the least recently used"
    assert cache.match(rows_of([1, 1, 1, 1, 1])).reused_rows == 4
    assert cache.match(rows_of([3, 3, 3])).reused_rows == 2


def test_one_steps_stores_never_claim_the_same_block_twice():
    """Two prompts stored in one step over a full pool: the second must not evict what the
    first just claimed (both copies would target one pool block in a single scatter)."""
    cache = PrefixCache(num_blocks=4, block_rows=4)
    a = cache.match(rows_of([1] * 17))
    b = cache.match(rows_of([2] * 17))  # 4 full blocks each, a pool of 4
    claims = cache.store([a, b])
    blocks = [block for copies in claims for _, block in copies]
    assert len(blocks) == len(set(blocks)) == 4, claims
    assert claims[1] == [], "every block is protected for this step; b stores nothing"
    assert cache.match(rows_of([1] * 17)).reused_rows == 16


def test_eviction_takes_a_chains_tail_and_keeps_its_head():
    cache = PrefixCache(num_blocks=8, block_rows=4)
    chain = rows_of(list(range(25)))  # 6 full blocks
    cache.store([cache.match(chain)])
    cache.store([cache.match(rows_of([100 + i for i in range(13)]))])  # 3 blocks: 2 free, 1 evicted
    assert cache.stats().blocks_evicted == 1
    assert cache.match(chain).reused_rows == 20, "only the chain's last block may have gone"


def test_forget_undoes_a_store_whose_copy_failed():
    cache = PrefixCache(num_blocks=4, block_rows=4)
    m = cache.match(rows_of(list(range(9))))
    claims = cache.store([m])
    cache.forget((m.hashes[index], block) for index, block in claims[0])
    assert cache.match(rows_of(list(range(9)))).reused_rows == 0
    assert cache.stats().pool_blocks_used == 0
    assert sorted(b for _, b in cache.store([m])[0]) == sorted(b for _, b in claims[0])  # blocks are free again


def test_prefix_config_is_validated():
    with pytest.raises(EngineConfigError, match="prefix_cache_rows"):
        EngineConfig(prefix_cache_rows=-1)
    with pytest.raises(EngineConfigError, match="prefix_cache_rows .*prefix_block_rows"):
        EngineConfig(prefix_cache_rows=8, prefix_block_rows=16)
    with pytest.raises(EngineConfigError, match="prefix_block_rows"):
        EngineConfig(prefix_block_rows=0)
    assert EngineConfig(prefix_cache_rows=0).prefix_blocks == 0
    assert EngineConfig(prefix_cache_rows=100, prefix_block_rows=16).prefix_blocks == 6
    with pytest.raises(ValueError, match="num_blocks"):
        PrefixCache(0, 16)


def test_pool_copies_move_whole_blocks_of_every_layer():
    kv = StaticKVCache(num_layers=3, num_slots=2, max_seq_len=10, kv_heads=2, head_dim=4,
                       prefix_blocks=4, prefix_block_rows=4)
    assert kv.slot_rows == 12  # rounded up to whole blocks
    kv.setup(torch.device("cpu"), torch.float32)
    for layer in range(3):
        kv.k[layer].copy_(torch.randn_like(kv.k[layer]))
        kv.v[layer].copy_(torch.randn_like(kv.v[layer]))
    kv.store_prefix(torch.tensor([kv.slot_block(0, 0), kv.slot_block(0, 1)]), torch.tensor([3, 1]))
    kv.load_prefix(torch.tensor([kv.slot_block(1, 0), kv.slot_block(1, 1)]), torch.tensor([3, 1]))
    for layer in range(3):
        assert torch.equal(kv.k[layer][1, :8], kv.k[layer][0, :8])
        assert torch.equal(kv.v[layer][1, :8], kv.v[layer][0, :8])
        assert not torch.equal(kv.k[layer][1, 8:], kv.k[layer][0, 8:])


# ---- the engine with reuse ----

@pytest.fixture(scope="module")
def shared_prompts(builder):
    """Prompts of one speaker (same reference codes, same instruction block), different texts."""
    ref = torch.randint(0, 1024, (20, 12), generator=torch.Generator().manual_seed(11))
    fields = PromptFields(instruction="warm and slow", language="English")
    texts = ["First sentence.", "A second, rather longer sentence follows here.", "Third.",
             "Fourth one, with a pause [pause 0.3s] inside.", "Fifth."]
    return [builder.build(PromptSpec(t, fields, reference_codes=ref)) for t in texts]


def run_and_check(model, prompts, params, **config):
    """The first prompt alone (its blocks land in the pool), then the rest together; every
    request's codes must equal generation.generate's. Returns the engine's stats."""
    reference = generate(model, prompts, params)
    sink = Collector()
    engine = Engine(model, EngineConfig(**config), sink)
    engine.start()
    ids = [f"p{i}" for i in range(len(prompts))]
    try:
        engine.submit(EngineRequest(ids[0], prompts[0], params[0]))
        sink.wait_finished(ids[:1])
        for rid, rows, p in zip(ids[1:], prompts[1:], params[1:]):
            engine.submit(EngineRequest(rid, rows, p))
        sink.wait_finished(ids)
    finally:
        engine.shutdown(TIMEOUT_S)
    for rid, ref in zip(ids, reference):
        assert_matches_reference(sink, rid, ref)
    return engine.stats()


def mixed_params(n: int) -> list[SamplingParams]:
    return [SamplingParams.greedy(max_frames=8, ignore_stop=True) if i % 2 else
            SamplingParams(seed=40 + i, max_frames=10, ignore_stop=True) for i in range(n)]


def test_reused_prefixes_give_the_reference_codes(tiny_model, shared_prompts):
    params = mixed_params(len(shared_prompts))
    stats = run_and_check(tiny_model, shared_prompts, params, max_running_requests=4,
                          prefix_cache_rows=256, prefix_block_rows=8)
    shared = min(r.shape[0] for r in shared_prompts)
    assert stats.prefix_prompt_rows == sum(r.shape[0] for r in shared_prompts)
    # Every later prompt reuses at least the whole blocks of the shared speaker prefix.
    common = next(i for i in range(shared) if not all(torch.equal(r[i], shared_prompts[0][i])
                                                      for r in shared_prompts))
    assert stats.prefix_reused_rows >= (len(shared_prompts) - 1) * (common // 8 * 8) > 0, (common, stats)
    assert stats.prefix_blocks_stored > 0 and stats.prefix_blocks_evicted == 0


def test_reuse_off_gives_the_reference_and_records_nothing(tiny_model, shared_prompts):
    params = mixed_params(3)
    stats = run_and_check(tiny_model, shared_prompts[:3], params, max_running_requests=2,
                          prefix_cache_rows=0)
    assert stats.prefix_reused_rows == 0 and stats.prefix_prompt_rows == 0


def test_a_tiny_pool_evicts_across_speakers_and_still_gives_the_reference(tiny_model, builder,
                                                                         shared_prompts):
    other = torch.randint(0, 1024, (20, 12), generator=torch.Generator().manual_seed(12))
    stranger = builder.build(PromptSpec("Somebody else speaks.", reference_codes=other))
    prompts = shared_prompts[:2] + [stranger] + shared_prompts[2:]
    params = mixed_params(len(prompts))
    # Three blocks of 4 rows: the pool holds the head of one chain at a time.
    stats = run_and_check(tiny_model, prompts, params, max_running_requests=1,
                          prefix_cache_rows=12, prefix_block_rows=4)
    assert stats.prefix_blocks_evicted > 0 and stats.prefix_pool_blocks_used == 3
    assert stats.prefix_reused_rows > 0


def test_a_long_suffix_after_a_reused_prefix_is_prefilled_chunk_by_chunk(tiny_model, shared_prompts):
    """prefill_chunk_tokens below the suffix: the chunked path starts at the reused prefix."""
    params = mixed_params(3)
    stats = run_and_check(tiny_model, shared_prompts[:3], params, max_running_requests=2,
                          prefix_cache_rows=256, prefix_block_rows=8, prefill_chunk_tokens=8)
    assert stats.prefix_reused_rows > 0
