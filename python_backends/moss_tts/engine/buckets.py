"""Shape buckets: which padded shapes a step runs at, and which of them have a CUDA graph.

Policy only, no tensors. On a GPU every step is padded to a bucket whether or not graphs are
on, so the eager path (enforce_eager) computes exactly what a replay computes; beyond the
largest bucket a step runs eagerly at its exact size. On the CPU nothing is padded.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
TOKEN_BUCKET = 32  # a single prompt's rows are padded to a multiple of this (one graph per multiple)
BATCH_TOKEN_MULTIPLE = 16  # several prompts prefilled together: rows padded to a multiple of this
# A single prompt after a reused prefix has a graph per (rows left, key window) up to this many
# rows left: after a speaker's reference that is the text, rarely longer; longer runs eagerly.
PREFIX_GRAPH_TOKENS = 256
# Several prompts prefilled together: a graph per (prompts, rows) bucket pair of at most
# BATCH_PREFILL_GRAPH_TOKENS padded rows, without a reused prefix or after one with a key window
# of the smallest KV bucket (an instruction block or a short reference, then the text). Why:
# an eager batched prefill costs ~100 ms of host time on the H200 however few its rows, and
# every running stream waits for it; a replay costs well under a millisecond. Prompts past the
# largest bucket are padded to the scratch slot (ModelRunner), so their rows are thrown away.
BATCH_PREFILL_PROMPTS = (2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
BATCH_PREFILL_ROWS = (16, 32, 64, 128, 256)
BATCH_PREFILL_GRAPH_TOKENS = 8192


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class Buckets:
    batch: tuple[int, ...]  # decode batch sizes (slot ranges [0, S)), ascending
    kv: tuple[int, ...]  # attention windows of a decode step, ascending, last = max_seq_len
    prefill_tokens: tuple[int, ...]  # single-prompt prefill lengths with a graph, ascending
    is_padded: bool  # False on the CPU: exact shapes everywhere
    # (prompts, rows) of the batched prefills with a graph (no reused prefix, or key window kv[0])
    prefill_batches: tuple[tuple[int, int], ...] = ()

    @classmethod
    def build(cls, max_running: int, max_seq_len: int, max_graph_batch: int, min_kv: int,
              prefill_tokens: int, is_padded: bool) -> "Buckets":
        if not is_padded:
            return cls((), (), (), False)
        top = min(max_graph_batch, max_running)
        batch = tuple(b for b in BATCH_BUCKETS if b < top) + (top,)
        kv, window = [], min(min_kv, max_seq_len)
        while window < max_seq_len:
            kv.append(window)
            window *= 2
        kv.append(max_seq_len)
        tokens = tuple(range(TOKEN_BUCKET, min(prefill_tokens, max_seq_len) + 1, TOKEN_BUCKET))
        prompts = tuple(n for n in BATCH_PREFILL_PROMPTS if n < max_running) + (max_running,) \
            if max_running > 1 else ()
        rows = tuple(t for t in BATCH_PREFILL_ROWS if t <= min(prefill_tokens, max_seq_len))
        batches = tuple((n, t) for n in prompts for t in rows if n * t <= BATCH_PREFILL_GRAPH_TOKENS)
        return cls(batch, tuple(kv), tokens, True, batches)

    def decode_shape(self, num_slots: int, kv_len: int) -> tuple[int, int]:
        """(S, K) a decode step over slots [0, num_slots) needing kv_len keys runs at."""
        return self._pad(self.batch, num_slots), self._pad(self.kv, kv_len)

    def prefill_len(self, num_prompts: int, num_tokens: int) -> int:
        """Rows a prefill of num_prompts prompts, the longest num_tokens rows, runs at."""
        if not self.is_padded:
            return num_tokens
        return _round_up(num_tokens, TOKEN_BUCKET if num_prompts == 1 else BATCH_TOKEN_MULTIPLE)

    def batch_prefill_shape(self, num_prompts: int, num_tokens: int, window: int) -> tuple[int, int]:
        """(prompts, rows) a prefill of num_prompts >= 2 prompts, the longest num_tokens rows
        after their reused prefixes, with key window `window` (0 = no reused prefix), runs at:
        the smallest batched-prefill bucket pair holding it, else num_prompts exactly."""
        if self.is_padded and window in self.batch_prefill_windows:
            n = next((n for n, _ in self.prefill_batches if n >= num_prompts), None)
            t = next((t for m, t in self.prefill_batches if m == n and t >= num_tokens), None)
            if t is not None:
                return n, t
        return num_prompts, self.prefill_len(num_prompts, num_tokens)

    @property
    def batch_prefill_windows(self) -> tuple[int, ...]:
        """Key windows of the batched-prefill graphs: none (0) and the smallest KV bucket."""
        return (0, self.kv[0]) if self.kv else ()

    @property
    def batch_prefill_shapes(self) -> tuple[tuple[int, int, int], ...]:
        """(prompts, rows, key window) of every batched-prefill graph, largest first."""
        return tuple(sorted(((n, t, w) for n, t in self.prefill_batches for w in self.batch_prefill_windows
                             if w == 0 or t <= w), key=lambda s: (s[0] * s[1], s), reverse=True))

    def has_decode_graph(self, num_slots: int, kv_len: int) -> bool:
        return num_slots in self.batch and kv_len in self.kv

    def has_prefill_graph(self, num_prompts: int, num_tokens: int) -> bool:
        return num_prompts == 1 and num_tokens in self.prefill_tokens

    @property
    def prefix_prefill_shapes(self) -> tuple[tuple[int, int], ...]:
        """(rows left, key window) of the single-prompt prefills after a reused prefix that
        have a graph: the window is a decode KV bucket, so reading the prefix costs what the
        prompt needs, not a whole slot."""
        return tuple((t, w) for t in self.prefill_tokens if t <= PREFIX_GRAPH_TOKENS for w in self.kv)

    def key_window(self, num_rows: int) -> int:
        """The smallest KV bucket holding num_rows keys (num_rows itself on the CPU)."""
        return self._pad(self.kv, num_rows) if self.is_padded else num_rows

    def _pad(self, buckets: tuple[int, ...], n: int) -> int:
        i = bisect_left(buckets, n)
        return buckets[i] if i < len(buckets) else n
