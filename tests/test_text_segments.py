"""Long text is cut where speech pauses anyway: sentences, then clauses, then words."""

from __future__ import annotations

import pytest

from moss_tts.contract.text_segments import split_text


def check(text, max_chars):
    segments = split_text(text, max_chars)
    assert "".join(segments) == text.strip()
    assert all(0 < len(s) <= max_chars for s in segments)
    return segments


def test_short_text_is_one_segment():
    assert split_text("  Hello there.  ") == ["Hello there."]
    assert split_text("   ") == []


def test_sentences_are_packed_whole():
    text = "One two three. Four five six! Seven eight nine? Ten eleven twelve."
    assert check(text, 32) == ["One two three. Four five six! ", "Seven eight nine? ", "Ten eleven twelve."]


def test_a_long_sentence_is_cut_at_clauses_then_words():
    text = "This sentence, which goes on and on, has clauses; " + "word " * 20 + "end."
    segments = check(text, 40)
    assert segments[0] == "This sentence, which goes on and on, "
    assert all(s.endswith((" ", ",", ";", ".")) or s == segments[-1] for s in segments)


def test_chinese_sentence_marks_and_text_without_spaces():
    text = "今天天气很好。我们去公园散步吧！" + "长" * 50
    segments = check(text, 20)
    assert segments[0] == "今天天气很好。我们去公园散步吧！"


def test_pause_markup_is_never_split():
    text = "a" * 10 + " [pause 0.5s] " + "b " * 30
    assert all("[pause" not in s or "[pause 0.5s]" in s for s in check(text, 25))


def test_ten_thousand_characters():
    sentence = "The quick brown fox jumps over the lazy dog, again and again. "
    segments = check(sentence * 160, 400)  # 62 characters: 6 sentences a segment, 27 segments
    assert len(segments) == 27 and all(s.endswith(". ") or s == segments[-1] for s in segments)


def test_a_tiny_limit_is_refused():
    with pytest.raises(ValueError, match="at least 20"):
        split_text("x" * 100, 5)
