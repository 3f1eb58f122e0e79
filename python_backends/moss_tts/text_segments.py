"""Long text -> segments the model speaks well: whole sentences, else clauses, else words.

A segment ends at a sentence end (. ! ? and their CJK forms, or a blank line) when it can; a
sentence longer than `max_chars` is cut at a clause mark (, ; : and CJK forms), and a clause
longer than that at a space (or anywhere, for text without spaces). Segments never exceed
`max_chars`, keep every character of the input in order, and short sentences are packed together
up to `max_chars`. Pause markup (`[pause 0.5s]`) is never split.
"""

from __future__ import annotations

import re

MAX_SEGMENT_CHARS = 400  # about 25-30 s of English speech: long enough for prosody, short for the row budget

_SENTENCE_END = re.compile(r"(?<=[.!?。！？…])[\"'”’」』)）]*\s+|(?<=[。！？])|\n\s*\n")
_CLAUSE_END = re.compile(r"(?<=[,;:，；：、])\s*")
_PAUSE = re.compile(r"\[pause [^\]]*\]")


def split_text(text: str, max_chars: int = MAX_SEGMENT_CHARS) -> list[str]:
    """Segments of at most `max_chars` whose concatenation is `text` (stripped of outer blanks)."""
    if max_chars < 20:
        raise ValueError(f"max_chars must be at least 20, got {max_chars}")
    text = text.strip()
    if len(text) <= max_chars:
        return [text] if text else []
    pieces = []
    for sentence in _split_keep(text, _SENTENCE_END):
        pieces.extend(_fit(sentence, max_chars))
    return _pack(pieces, max_chars)


def _split_keep(text: str, pattern: re.Pattern) -> list[str]:
    """Split after each match, keeping every character (the separator stays with the left part)."""
    parts, start = [], 0
    for match in pattern.finditer(text):
        end = match.end()
        if end > start:
            parts.append(text[start:end])
            start = end
    if start < len(text):
        parts.append(text[start:])
    return parts


def _fit(sentence: str, max_chars: int) -> list[str]:
    if len(sentence) <= max_chars:
        return [sentence]
    out = []
    for clause in _split_keep(sentence, _CLAUSE_END):
        if len(clause) <= max_chars:
            out.append(clause)
        else:
            out.extend(_cut_words(clause, max_chars))
    return out


def _cut_words(clause: str, max_chars: int) -> list[str]:
    """At spaces, never inside pause markup; a run without spaces is cut at max_chars."""
    protected = [(m.start(), m.end()) for m in _PAUSE.finditer(clause)]
    out, start = [], 0
    while len(clause) - start > max_chars:
        limit = start + max_chars
        cut = clause.rfind(" ", start + 1, limit)  # the piece keeps its space: cut + 1 - start <= max_chars
        while cut > start and any(a < cut < b for a, b in protected):
            cut = clause.rfind(" ", start + 1, cut)
        if cut <= start:
            cut = limit
        out.append(clause[start:cut + (clause[cut:cut + 1] == " ")])
        start += len(out[-1])
    out.append(clause[start:])
    return [piece for piece in out if piece]


def _pack(pieces: list[str], max_chars: int) -> list[str]:
    """Pack pieces in order into segments of at most max_chars; blank pieces join their neighbour."""
    segments: list[str] = []
    for piece in pieces:
        if segments and (not piece.strip() or len(segments[-1]) + len(piece) <= max_chars):
            segments[-1] += piece
        else:
            segments.append(piece)
    return segments
