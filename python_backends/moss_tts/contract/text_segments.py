"""Long text -> segments the model speaks well: whole sentences, else clauses, else words.

A segment ends at a sentence end (. ! ? and their CJK forms, or a blank line) when it can; a
sentence longer than `max_chars` is cut at a clause mark (, ; : and CJK forms), and a clause
longer than that at a space (or anywhere, for text without spaces). Segments never exceed
`max_chars`, keep every character of the input in order, and short sentences are packed together
up to `max_chars`. Pause markup (`[pause 0.5s]`) is never split.
"""

from __future__ import annotations

import re
from typing import Optional

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


# ---------------------------------------------------------------- text that arrives in pieces
MIN_CLAUSE_CHARS = 60  # a clause mark cuts only once this much text waits (shorter: choppy speech)

# A cut is decided by the text alone: each pattern needs the character after its whitespace (or
# the end of input) before it matches, so where the text was split into pieces never matters.
_CLOSERS = "\"'”’」』)）"
_STREAM_SENTENCE = re.compile(rf"[.!?…][{_CLOSERS}]*\s+(?=\S)|[。！？][{_CLOSERS}]*\s*(?=[^\s{_CLOSERS}])"
                              r"|\n\s*\n\s*(?=\S)")
_STREAM_CLAUSE = re.compile(rf"(?:[,;:—–]|\s-)[{_CLOSERS}]*\s+(?=\S)|[，；：、][{_CLOSERS}]*\s*(?=[^\s{_CLOSERS}])")
_OPEN_PAUSE = re.compile(r"\[pause [^\]]*$|\[(p(a(u(s(e)?)?)?)?)?$")


class TextSegmenter:
    """Text pushed in pieces (an LLM's deltas) -> segments, each as soon as it is complete.

    A segment ends at a sentence end once the next non-blank character confirms it, at a clause
    mark (, ; : — and CJK forms) once the segment has `min_clause_chars`, else at the last space
    before `max_chars` (never inside pause markup or a word, as `split_text`). Without `flush`,
    the segments depend only on the text, never on how it was cut into pieces. Unlike
    `split_text`, which packs short sentences up to `max_chars` (it sees the whole text), every
    sentence here is a segment of its own: its audio can start before the next one is written.
    Segments are stripped of outer blanks and never empty.
    """

    def __init__(self, max_chars: int = MAX_SEGMENT_CHARS, min_clause_chars: int = MIN_CLAUSE_CHARS) -> None:
        if max_chars < 20 or not 0 < min_clause_chars <= max_chars:
            raise ValueError(f"max_chars must be >= 20 and 0 < min_clause_chars <= max_chars, got {max_chars}, "
                             f"{min_clause_chars}")
        self.max_chars = max_chars
        self.min_clause_chars = min_clause_chars
        self._buffer = ""
        self._is_ended = False

    @property
    def buffered(self) -> str:
        return self._buffer

    def push(self, delta: str) -> list[str]:
        """Add text; the segments it completed."""
        if self._is_ended:
            raise ValueError("push after end(): start a new TextSegmenter")
        self._buffer += delta
        return self._take(final=False)

    def flush(self) -> list[str]:
        """Everything buffered, now (an open pause markup stays for the next piece)."""
        segments = self._take(final=False)
        open_pause = _OPEN_PAUSE.search(self._buffer)
        keep = open_pause.start() if open_pause else len(self._buffer)
        segments += self._emit(keep)
        return segments

    def end(self) -> list[str]:
        """The input is complete: the remaining segments."""
        self._is_ended = True
        segments = self._take(final=True)
        return segments + self._emit(len(self._buffer))

    def _take(self, final: bool) -> list[str]:
        segments = []
        while (cut := self._next_cut(final)) is not None:
            segments += self._emit(cut)
        return segments

    def _emit(self, cut: int) -> list[str]:
        segment, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:]
        return [segment] if segment else []

    def _next_cut(self, final: bool) -> Optional[int]:
        """Where the first complete segment of the buffer ends, or None while it is not known yet."""
        text = self._buffer.lstrip()
        offset = len(self._buffer) - len(text)
        protected = [(m.start(), m.end()) for m in _PAUSE.finditer(text)]
        if not final:
            open_pause = _OPEN_PAUSE.search(text)
            if open_pause:  # markup still arriving: nothing after its start is decided
                protected.append((open_pause.start(), len(text) + 1))
        inside = lambda at: any(a < at < b for a, b in protected)  # noqa: E731
        # The earliest cut of either kind: one found here is confirmed, and an earlier one would be too.
        cuts = [end for end in (_first_cut(text, pattern, min_chars, self.max_chars, inside) for pattern, min_chars
                                in ((_STREAM_SENTENCE, 0), (_STREAM_CLAUSE, self.min_clause_chars))) if end is not None]
        if cuts:
            return offset + min(cuts)
        if len(text) <= self.max_chars or not (final or text[self.max_chars:].strip()):
            return None  # fits (or may still end at a mark): wait
        return offset + _word_cut(text, self.max_chars, protected)


def _first_cut(text: str, pattern: re.Pattern, min_chars: int, max_chars: int, inside) -> Optional[int]:
    for match in pattern.finditer(text):
        if match.end() > max_chars:
            return None
        if match.start() + 1 >= min_chars and not inside(match.start()) and not inside(match.end()):
            return match.end()
    return None


def _word_cut(text: str, max_chars: int, protected: list[tuple[int, int]]) -> int:
    """After the last space before `max_chars` outside pause markup (else at `max_chars`)."""
    cut = text.rfind(" ", 1, max_chars)
    while cut > 0 and any(a < cut < b for a, b in protected):
        cut = text.rfind(" ", 1, cut)
    return cut + 1 if cut > 0 else max_chars
