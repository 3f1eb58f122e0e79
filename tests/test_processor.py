"""Prompt rows [T, 13] for text-only, clone, continuation and fields cases (spec 2.1)."""

from __future__ import annotations

import pytest
import torch

from moss_tts.model.processor import PromptError, PromptFields, PromptSpec, parse_tokens, split_token_prefix

IM_START, IM_END, AUDIO_START, AUDIO_END, USER_SLOT, ASSIST_SLOT = 151644, 151645, 151669, 151670, 151654, 151656


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def expected_text_ids(tok, text, fields=PromptFields(), reference="None"):
    return ([IM_START] + enc(tok, "user\n") + enc(tok, "<user_inst>\n- Reference(s):\n") + enc(tok, reference)
            + enc(tok, fields.render()) + enc(tok, text) + enc(tok, "\n</user_inst>") + [IM_END]
            + enc(tok, "\n") + [IM_START] + enc(tok, "assistant\n") + [AUDIO_START])


def test_text_only_rows(builder, tiny_tokenizer):
    rows = builder.build(PromptSpec("Hello world [pause 1.5s] 你好"))
    assert rows.dtype == torch.long and rows.shape[1] == 13
    assert rows[:, 0].tolist() == expected_text_ids(tiny_tokenizer, "Hello world [pause 1.5s] 你好")
    assert (rows[:, 1:] == 1024).all()


def test_fields_block_renders_every_field(tiny_tokenizer):
    fields = PromptFields(instruction=" warm, slow ", tokens=42, language="English")
    assert fields.render() == ("\n- Instruction:\nwarm, slow\n- Tokens:\n42\n- Quality:\nNone\n- Sound Event:\nNone"
                               "\n- Ambient Sound:\nNone\n- Language:\nEnglish\n- Text:\n")
    assert PromptFields(instruction="  ").render().startswith("\n- Instruction:\nNone\n")


def test_pieces_are_tokenized_separately(builder, tiny_tokenizer):
    # BPE boundaries follow the pieces: the fields block and the text are encoded apart.
    # "\n- Text:\n" + "Hello" would merge across the boundary if encoded as one string.
    fields = PromptFields(language="French")
    rows = builder.build(PromptSpec("Hello", fields))
    apart = enc(tiny_tokenizer, fields.render()) + enc(tiny_tokenizer, "Hello")
    assert rows[:, 0].tolist() == expected_text_ids(tiny_tokenizer, "Hello", fields)
    start = rows[:, 0].tolist().index(apart[0], 5)
    assert rows[start:start + len(apart), 0].tolist() == apart


def test_voice_clone_rows(builder, tiny_tokenizer):
    ref = torch.randint(0, 1024, (5, 12))
    fields = PromptFields(instruction="calm", language="English", tokens=30)
    rows = builder.build(PromptSpec("Hi there", fields, reference_codes=ref, reference_text="ignored in clone mode"))
    head = [IM_START] + enc(tiny_tokenizer, "user\n") + enc(tiny_tokenizer, "<user_inst>\n- Reference(s):\n")
    n = len(head)
    assert rows[:n, 0].tolist() == head
    assert rows[n, 0] == AUDIO_START and (rows[n, 1:] == 1024).all()
    assert (rows[n + 1:n + 6, 0] == USER_SLOT).all() and torch.equal(rows[n + 1:n + 6, 1:], ref)
    assert rows[n + 6, 0] == AUDIO_END
    tail = (enc(tiny_tokenizer, fields.render()) + enc(tiny_tokenizer, "Hi there") + enc(tiny_tokenizer, "\n</user_inst>")
            + [IM_END] + enc(tiny_tokenizer, "\n") + [IM_START] + enc(tiny_tokenizer, "assistant\n") + [AUDIO_START])
    assert rows[n + 7:, 0].tolist() == tail
    assert (rows[n + 7:, 1:] == 1024).all()


def test_continuation_rows(builder, tiny_tokenizer):
    ref = torch.randint(0, 1024, (4, 12))
    rows = builder.build(PromptSpec("target words", reference_codes=ref, reference_text="Ref words. ", mode="continuation"))
    text_ids = expected_text_ids(tiny_tokenizer, "Ref words. target words")
    assert rows[:len(text_ids), 0].tolist() == text_ids
    assert (rows[len(text_ids):, 0] == ASSIST_SLOT).all() and torch.equal(rows[len(text_ids):, 1:], ref)
    assert rows.shape[0] == len(text_ids) + 4


def test_token_prefix_and_tokens_parameter():
    assert split_token_prefix("${token:75}Hello") == (75, "Hello")
    assert split_token_prefix("Hello ${token:75}") == (None, "Hello ${token:75}")
    assert parse_tokens("12") == 12
    with pytest.raises(PromptError, match="positive integer"):
        split_token_prefix("${token:abc}Hi")
    with pytest.raises(PromptError, match=r"\[1, 22500\]"):
        parse_tokens(0)


@pytest.mark.parametrize("spec, message", [
    (PromptSpec(""), "text is empty"),
    (PromptSpec("   \n"), "text is empty"),
    (PromptSpec("x" * 20001), "limit is 20000"),
    (PromptSpec("hi", mode="continuation"), "continuation mode needs reference"),
    (PromptSpec("hi", mode="sing"), "mode must be"),
    (PromptSpec("hi", reference_codes=torch.zeros(3, 8, dtype=torch.long)), r"shape \[frames>0, 12\]"),
    (PromptSpec("hi", reference_codes=torch.full((3, 12), 1024)), r"\[0, 1024\)"),
    (PromptSpec("hi", reference_codes=torch.zeros(3, 12)), "must be integers"),
])
def test_bad_prompts_are_rejected_clearly(builder, spec, message):
    with pytest.raises(PromptError, match=message):
        builder.build(spec)


def test_the_rust_tokenizer_path_gives_transformers_ids(builder, tiny_tokenizer):
    """PromptBuilder encodes with the tokenizer's Rust backend (no transformers Python per call):
    the same ids as transformers' encode, special-token text, whitespace and scripts included."""
    import random

    assert builder._backend is not None  # the fast path is the one tested
    rng = random.Random(0)
    pieces = ["Hello", " world", "[pause 1.5s]", "你好", "ni3 hao3", "ˈwɜːld", "<|im_start|>", "<|im_end|>", "\n",
              "\t", "  ", "Ünïcödé", "123.45", "!?", "${token:40}", "</user_inst>", "é́", "🙂"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(300)]
    for text in texts:
        assert builder._encode(text) == enc(tiny_tokenizer, text), repr(text)
    # the fields block, cached per rendered text, is each spec's own
    for language in ("English", "Chinese", "English"):
        fields = PromptFields(language=language)
        rows = builder.build(PromptSpec("Hi there.", fields=fields))
        assert rows[:, 0].tolist() == expected_text_ids(tiny_tokenizer, "Hi there.", fields)


def test_tokenizing_gives_the_gil_up(builder):
    """A prompt's text is tokenized with the GIL released (issue 34): at a wave of 256 requests a
    tokenizer call that held it blocked the engine thread for its whole length, since a C call is
    not preempted by the switch interval. GilCounter's thread counts only while it holds the GIL,
    and nothing takes the GIL from this thread by force while it counts, so the count moves during
    the call only if the tokenizer released it. Up to 20 calls: on a loaded machine (CI's two
    cores) the counter's OS thread may get no CPU during one call's release; a tokenizer that holds
    the GIL leaves the count still in every one."""
    import gc

    from perf.gil_counter import GilCounter

    text = "The quick brown fox jumps over the lazy dog, and then it runs far away. " * 100
    ids = builder._encode(text)  # warm: the first call may allocate the binding's caches
    gc.collect()
    gc.disable()  # a collection could finalize another test's garbage with the GIL given up
    try:
        with GilCounter() as gil:
            for _ in range(20):
                before = gil.count()
                again = builder._encode(text)
                released = gil.count() - before
                assert again == ids
                if released:
                    break
    finally:
        gc.enable()
    assert released > 0, "tokenizing held the GIL for the whole call, 20 calls in a row"
