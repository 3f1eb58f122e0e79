"""TextSegmenter: text pushed in pieces is cut where speech can start early, by the text alone."""

from __future__ import annotations

import random

import pytest

from moss_tts.contract.text_segments import MAX_SEGMENT_CHARS, TextSegmenter, split_text

TEXTS = [
    "Hello there. This is a test, with a clause; and more words that go on for a while, yes, indeed it does.",
    "今天天气很好。我们去公园散步吧！好的，走吧。",
    'Wait [pause 0.5s] now! "Quoted." Done',
    "No marks at all " * 40,
    "A sentence that ends... Then: a colon, a dash — and another one.\n\nNew paragraph here?  Yes!",
    "Word" * 130 + " end.",
    "[pause 1s] Starts with a pause. [pause 2.5s]",
]


def whole(text, **options):
    segmenter = TextSegmenter(**options)
    return segmenter.push(text) + segmenter.end()


def in_pieces(text, rng, **options):
    segmenter, segments, at = TextSegmenter(**options), [], 0
    while at < len(text):
        size = rng.choice((1, 1, 2, 3, 5, 8, 40))
        segments += segmenter.push(text[at:at + size])
        at += size
    return segments + segmenter.end()


def check(text, segments, max_chars=MAX_SEGMENT_CHARS):
    assert "".join("".join(segments).split()) == "".join(text.split())  # every character but blanks, in order
    assert all(s and s == s.strip() and len(s) <= max_chars for s in segments)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("options", [{}, {"max_chars": 40, "min_clause_chars": 15}])
def test_segments_do_not_depend_on_how_the_text_arrived(text, options):
    expected = whole(text, **options)
    check(text, expected, options.get("max_chars", MAX_SEGMENT_CHARS))
    rng = random.Random(len(text))
    for _ in range(30):
        assert in_pieces(text, rng, **options) == expected


def test_random_texts_in_random_pieces():
    rng = random.Random(5)
    alphabet = list("abc de fg  ,.;:!?。，") + ["[pause 0.5s]", "[pau", "]", "\n\n", "—", '"', "...", "  "]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        expected = whole(text, max_chars=25, min_clause_chars=10)
        check(text, expected, 25)
        assert in_pieces(text, rng, max_chars=25, min_clause_chars=10) == expected


def test_a_sentence_is_sent_once_the_next_word_begins():
    segmenter = TextSegmenter()
    assert segmenter.push("Hello there.") == []  # "there.5" or "there.com" may follow
    assert segmenter.push(" ") == []
    assert segmenter.push("Next") == ["Hello there."]
    assert segmenter.end() == ["Next"]


def test_a_clause_waits_for_enough_text():
    segmenter = TextSegmenter(min_clause_chars=30)
    assert segmenter.push("Short, clause, ") == []
    assert segmenter.push("and now a longer stretch, then") == ["Short, clause, and now a longer stretch,"]


def test_pause_markup_is_never_cut_and_flush_keeps_an_open_one():
    segmenter = TextSegmenter(max_chars=20, min_clause_chars=5)
    assert segmenter.push("Say it [pause 0.") == []
    assert segmenter.flush() == ["Say it"]
    assert segmenter.push("5s] again. More") == ["[pause 0.5s] again."]
    assert segmenter.flush() == ["More"]
    assert segmenter.end() == []


def test_a_long_run_is_cut_at_a_word_before_the_limit():
    text = "word " * 30
    segments = whole(text, max_chars=22, min_clause_chars=10)
    assert segments[0] == "word word word word" and all(len(s) <= 22 for s in segments)


def test_agrees_with_split_text_on_one_sentence_and_on_sentence_ends():
    assert whole("Just one sentence, short.") == split_text("Just one sentence, short.")
    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    # split_text packs sentences up to max_chars; each of its cuts is a cut here too.
    ends, at = set(), 0
    for segment in whole(text):
        at = text.index(segment, at) + len(segment)
        ends.add(at)
    at = 0
    for segment in split_text(text)[:-1]:
        at += len(segment.rstrip())
        assert at in ends
        at += len(segment) - len(segment.rstrip())


def test_push_after_end_is_refused():
    segmenter = TextSegmenter()
    segmenter.end()
    with pytest.raises(ValueError, match="new TextSegmenter"):
        segmenter.push("more")
