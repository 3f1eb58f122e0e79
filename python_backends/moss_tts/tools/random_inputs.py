"""Random but valid prompt rows for benchmarks and GPU tests (no tokenizer needed)."""

from __future__ import annotations

import torch

AUDIO_START = 151669  # ends every real prompt (processor.PromptBuilder)
AUDIO_PAD = 1024


def random_prompt_rows(rows: int, seed: int) -> torch.Tensor:
    """[rows, 13] int64: seeded random text ids, no audio codes, the last row audio_start."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.full((rows, 13), AUDIO_PAD, dtype=torch.long)
    prompt[:, 0] = torch.randint(0, 150000, (rows,), generator=gen)
    prompt[-1, 0] = AUDIO_START
    return prompt
