"""kernels/block_copy.py: a step's prefix copies between the KV slots and the pool in one launch,
against the index copies it replaces (StaticKVCache.load_prefix / store_prefix, 64 blocks at a
time). A copy is exact, so every comparison is bit for bit: on CPU through Triton's interpreter
(one subprocess, since TRITON_INTERPRET must be set before triton is imported) and on a GPU at the
real sizes."""

from __future__ import annotations

import json

import pytest
import torch

from moss_tts.engine.kv_cache import StaticKVCache
from moss_tts.kernels import block_copy
from triton_interpreter import interpreter_json

INTERPRETER_TIMEOUT_S = 300


def filled_cache(layers, slots, rows, kv_heads, head_dim, blocks, block_rows, dtype, device, seed=0) -> StaticKVCache:
    kv = StaticKVCache(layers, slots, rows, kv_heads, head_dim, blocks, block_rows)
    kv.setup(torch.device(device), dtype)
    gen = torch.Generator().manual_seed(seed)
    for t in (kv._k_all, kv._v_all, kv._pool_k, kv._pool_v):  # every element its own value
        t.copy_(torch.randn(t.shape, generator=gen).to(dtype))
    return kv


def copy_case(layers, slots, rows, kv_heads, head_dim, blocks, block_rows, pairs, dtype="float32", device="cpu"):
    """Loads then stores of `pairs` (slot block, pool block) by the kernel and by index copies:
    {"loads": equal, "stores": equal, "moved": the copies changed something}."""
    dt = getattr(torch, dtype)
    caches = [filled_cache(layers, slots, rows, kv_heads, head_dim, blocks, block_rows, dt, device) for _ in range(2)]
    before = caches[0]._k_all.clone()
    slot_blocks = torch.tensor([caches[0].slot_block(s, b) for s, b, _ in pairs], device=device)
    pool_blocks = torch.tensor([p for _, _, p in pairs], device=device)
    result = {}
    for into_slots, name in ((True, "loads"), (False, "stores")):
        for kv, one in zip(caches, (False, True)):
            kv.copy_prefixes(len(pairs), slot_blocks, pool_blocks, into_slots, one_launch=one)
        result[name] = all(torch.equal(a, b) for a, b in zip(
            (caches[0]._k_all, caches[0]._v_all, caches[0]._pool_k, caches[0]._pool_v),
            (caches[1]._k_all, caches[1]._v_all, caches[1]._pool_k, caches[1]._pool_v)))
    result["moved"] = not torch.equal(before, caches[1]._k_all)
    return result


# name -> (layers, slots, rows, kv_heads, head_dim, pool blocks, block rows, pairs (slot, block, pool))
CASES = {
    "one_pair": (2, 3, 16, 2, 8, 4, 4, [(1, 0, 2)]),
    "many_pairs_partial_tiles": (3, 4, 20, 2, 8, 8, 4, [(0, 0, 5), (2, 1, 0), (3, 4, 7), (1, 2, 1)]),
    "large_block": (2, 2, 64, 4, 64, 3, 16, [(1, 0, 0), (1, 1, 2), (0, 3, 1)]),  # 4,096 elements a block
    "rows_not_whole_blocks": (2, 3, 10, 2, 4, 4, 4, [(2, 2, 3), (0, 1, 0)]),  # slot_rows rounded up to 12
}


def interpreter_main() -> None:
    """Run in a subprocess with TRITON_INTERPRET=1: prints {case: result} as JSON."""
    print(json.dumps({name: copy_case(*case) for name, case in CASES.items()}))


@pytest.fixture(scope="module")
def interpreter_results() -> dict:
    return interpreter_json("test_block_copy", INTERPRETER_TIMEOUT_S)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_kernel_copies_what_the_index_copies_do(interpreter_results, name):
    assert interpreter_results[name] == {"loads": True, "stores": True, "moved": True}


def test_block_pairs_know_their_layout():
    kv = filled_cache(3, 2, 10, 2, 4, 5, 4, torch.float32, "cpu")
    assert (kv._pool_pair.size, kv._pool_pair.layer_stride, kv._pool_pair.block_stride) == (32, 160, 32)
    assert (kv._slot_pair.size, kv._slot_pair.layer_stride, kv._slot_pair.block_stride) == (32, 2 * 12 * 8, 32)
    # 2 slots of 12 rows (10 rounded up) as 3 blocks each, a row its 2 heads x 4 (kv_format.row_elements)
    assert kv._slot_pair.k.shape == (3, 6, 4, 8)
    with pytest.raises(AssertionError):
        block_copy.BlockPair.of(kv._k_all, kv._v_all[:, :1])


def test_no_pairs_copies_nothing():
    kv = filled_cache(2, 2, 8, 2, 4, 2, 4, torch.float32, "cpu")
    before = kv._k_all.clone()
    kv.copy_prefixes(0, None, None, True, one_launch=True)
    assert torch.equal(before, kv._k_all)


@pytest.mark.gpu
def test_gpu_kernel_copies_what_the_index_copies_do():
    """The real backbone's layout (36 layers, 8 heads of 128, 16-row blocks, bf16), 200 pairs: more
    than the index copies' 64-block batches."""
    gen = torch.Generator().manual_seed(2)
    slots, per_slot, pool = 64, 4, 256
    pairs = [(s, b, p) for (s, b), p in zip([(s, b) for s in range(slots) for b in range(4)][:200],
                                             torch.randperm(pool, generator=gen).tolist())]
    assert copy_case(36, slots, per_slot * 16, 8, 128, pool, 16, pairs, "bfloat16", "cuda") == \
        {"loads": True, "stores": True, "moved": True}
