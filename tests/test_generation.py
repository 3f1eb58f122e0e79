"""The reference loop: pad-code masking, seeding independent of the batch, greedy determinism."""

from __future__ import annotations

import torch

from moss_tts.contract.sampling_params import ChannelParams, SamplingParams
from moss_tts.model.generation import generate, left_pad
from moss_tts.model.processor import PromptFields, PromptSpec


def test_pad_code_adds_exactly_zero(tiny_model):
    m = tiny_model
    rows = torch.full((1, 2, 13), 1024)
    rows[0, :, 0] = torch.tensor([151656, 151643])
    rows[0, 0, 3] = 17
    emb = m.embed_rows(rows)
    assert torch.equal(emb[0, 1], m.transformer.embed_tokens.weight[151643])
    expected = m.transformer.embed_tokens.weight[151656] + m.audio_embeddings[2].weight[17]
    assert torch.equal(emb[0, 0], expected)


def test_left_pad_layout():
    a, b = torch.ones(3, 13, dtype=torch.long), torch.ones(5, 13, dtype=torch.long)
    rows, mask = left_pad([a, b], 151643, 1024)
    assert rows.shape == (2, 5, 13) and mask[0].tolist() == [False, False, True, True, True]
    assert rows[0, 0, 0] == 151643 and (rows[0, 0, 1:] == 1024).all()


def _prompts(builder):
    ref = torch.randint(0, 1024, (6, 12), generator=torch.Generator().manual_seed(3))
    return [
        builder.build(PromptSpec("Hello there.")),
        builder.build(PromptSpec("A much longer sentence to speak, with a pause [pause 0.5s] inside.",
                                 PromptFields(language="English", tokens=40))),
        builder.build(PromptSpec("Clone this voice.", reference_codes=ref)),
        builder.build(PromptSpec("and then it goes on", reference_codes=ref, reference_text="It starts ",
                                 mode="continuation")),
    ] * 2


def test_seeded_request_is_identical_alone_and_in_a_batch_of_8(tiny_model, builder):
    prompts = _prompts(builder)
    params = [SamplingParams(seed=100 + i, max_frames=16, ignore_stop=True) for i in range(8)]
    params[5] = SamplingParams(seed=105, max_frames=16, ignore_stop=True,
                               audio=ChannelParams(1.0, 0.95, 50, 1.3))
    batch = generate(tiny_model, prompts, params)
    for i in (1, 2, 5):
        alone = generate(tiny_model, [prompts[i]], [params[i]])[0]
        assert torch.equal(alone.codes, batch[i].codes), f"request {i} changed with its batch"
    # Different seeds on the same prompt really sample differently.
    assert not torch.equal(batch[0].codes, batch[4].codes)


def test_greedy_is_deterministic_and_context_dependent(tiny_model, builder):
    prompts = _prompts(builder)[:4]
    params = [SamplingParams.greedy(max_frames=10, ignore_stop=True)] * 4
    first = generate(tiny_model, prompts, params)
    second = generate(tiny_model, prompts, params)
    assert all(torch.equal(a.codes, b.codes) for a, b in zip(first, second))
    assert not torch.equal(first[0].codes, first[1].codes)


def test_frame_budget_and_stop(tiny_model, builder):
    prompts = _prompts(builder)[:2]
    out = generate(tiny_model, prompts, [SamplingParams(seed=1, max_frames=5, ignore_stop=True),
                                         SamplingParams(seed=2, max_frames=9, ignore_stop=True)])
    assert [r.codes.shape for r in out] == [(5, 12), (9, 12)]
    assert all(r.finish_reason == "max_frames" for r in out)
    assert all(int(r.codes.min()) >= 0 and int(r.codes.max()) < 1024 for r in out)
    # The greedy stop head of this random checkpoint stops at once: the stop path works.
    stopped = generate(tiny_model, prompts[:1], [SamplingParams.greedy(max_frames=9)])[0]
    assert stopped.finish_reason == "stop" and stopped.codes.shape[0] < 9


def test_repetition_penalty_changes_greedy_codes(tiny_model, builder):
    prompt = _prompts(builder)[:1]
    plain = generate(tiny_model, prompt, [SamplingParams.greedy(max_frames=12, ignore_stop=True)])[0]
    penal = generate(tiny_model, prompt, [SamplingParams.greedy(max_frames=12, ignore_stop=True,
                                                                repetition_penalty=5.0)])[0]
    assert torch.equal(plain.codes[0], penal.codes[0])  # nothing to penalise on frame 0
    assert not torch.equal(plain.codes, penal.codes)
