"""Counter-based seeded sampling: filtering order, greedy, determinism, batch invariance."""

from __future__ import annotations

import pytest
import torch

from moss_tts.contract.sampling_params import ChannelParams, SamplingError, SamplingParams, derive_row_seed
from moss_tts.model.sampler import ChannelTensors, apply_repetition_penalty, counter_hash, sample


def params(rows, **kw):
    return ChannelTensors.build([ChannelParams(**kw)] * rows, "cpu")


def test_hash_is_a_uint32_and_depends_on_every_input():
    seed, pos, tok = torch.tensor([7, 7, 8]), torch.tensor([0, 1, 0]), torch.arange(4).expand(3, 4)
    h = counter_hash(seed, pos, tok)
    assert h.dtype == torch.long and int(h.min()) >= 0 and int(h.max()) < 2**32
    assert not torch.equal(h[0], h[1]) and not torch.equal(h[0], h[2]) and len(set(h[0].tolist())) == 4


def test_greedy_is_argmax():
    logits = torch.randn(5, 1024)
    out = sample(logits, params(5, temperature=0.0, top_p=1.0, top_k=0), torch.arange(5), torch.zeros(5, dtype=torch.long))
    assert torch.equal(out, logits.argmax(-1))


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(4, 1024)
    seeds, pos = torch.arange(4), torch.arange(4)
    assert torch.equal(sample(logits, params(4, temperature=1.7, top_p=1.0, top_k=1), seeds, pos), logits.argmax(-1))
    assert torch.equal(sample(logits, params(4, temperature=1.7, top_p=1e-6, top_k=25), seeds, pos), logits.argmax(-1))


def test_samples_stay_inside_top_k():
    logits = torch.randn(64, 1024)
    out = sample(logits, params(64, temperature=5.0, top_p=1.0, top_k=25), torch.arange(64), torch.arange(64))
    top = logits.topk(25, dim=-1).indices
    assert (top == out.unsqueeze(-1)).any(-1).all()


def test_same_seed_and_position_repeat_and_differ_otherwise():
    logits = torch.randn(1, 1024).expand(3, 1024)
    p = params(3, temperature=1.7, top_p=0.8, top_k=25)
    a = sample(logits, p, torch.tensor([1, 1, 2]), torch.tensor([5, 5, 5]))
    assert a[0] == a[1]
    draws = {int(sample(logits[:1], params(1, temperature=3.0, top_p=1.0, top_k=0), torch.tensor([s]),
                        torch.tensor([0]))) for s in range(40)}
    assert len(draws) > 10  # it really samples


def test_distribution_follows_the_probabilities():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(4000, 3)
    out = sample(logits, params(4000, temperature=1.0, top_p=1.0, top_k=0), torch.arange(4000), torch.zeros(4000, dtype=torch.long))
    freq = torch.bincount(out, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_row_result_does_not_depend_on_batch_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(8, 1024)
    p_rows = [ChannelParams(1.7, 0.8, 25), ChannelParams(0.0, 1.0, 0), ChannelParams(1.0, 0.95, 50)] + \
             [ChannelParams(1.2, 1.0, 10)] * 5
    batch = sample(logits, ChannelTensors.build(p_rows, "cpu"), torch.arange(8) * 11, torch.arange(8) + 3)
    for i in range(8):
        alone = sample(logits[i:i + 1], ChannelTensors.build([p_rows[i]], "cpu"), torch.tensor([i * 11]),
                       torch.tensor([i + 3]))
        assert alone.item() == batch[i].item()


def test_repetition_penalty_rule():
    scores = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    out = apply_repetition_penalty(scores, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0]]
    assert torch.equal(apply_repetition_penalty(scores, seen, torch.tensor([1.0])), scores)


def test_seed_derivation_and_validation():
    assert derive_row_seed(42) == derive_row_seed(42) != derive_row_seed(43)
    assert 0 <= derive_row_seed(42) < 2**31
    assert SamplingParams(seed=42).row_seed == derive_row_seed(42)
    assert SamplingParams().audio == ChannelParams(1.7, 0.8, 25, 1.0)
    assert SamplingParams().stop == ChannelParams(1.0, 1.0, 50, 1.0)
    for bad, msg in [(dict(audio=ChannelParams(-1, 0.8, 25)), "temperature"),
                     (dict(audio=ChannelParams(1, 0.0, 25)), "top_p"),
                     (dict(audio=ChannelParams(1, 0.8, -2)), "top_k"),
                     (dict(audio=ChannelParams(1, 0.8, 25, 0.0)), "repetition_penalty"),
                     (dict(seed=-1), "seed"), (dict(max_frames=0), "max_frames")]:
        with pytest.raises(SamplingError, match=msg):
            SamplingParams(**bad)
