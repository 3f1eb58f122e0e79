"""Prompt rows [T, 13] exactly as the upstream processor builds them (spec section 2.1).

Each text piece is tokenized on its own (no special tokens added) and special ids are
inserted as raw ids, so BPE boundaries fall where upstream puts them. The text itself is
kept verbatim: `[pause 1.5s]`, pinyin and IPA are what the model was trained on.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..contract.prompt_fields import (MAX_TEXT_CHARS, TOKEN_PREFIX, PromptError, PromptFields, PromptSpec,  # noqa: F401
                                      parse_tokens, split_token_prefix)
from .config import MossTTSConfig

USER_PREFIX = "user\n"
REFERENCE_HEADER = "<user_inst>\n- Reference(s):\n"
NO_REFERENCE = "None"
USER_SUFFIX = "\n</user_inst>"
TURN_BREAK = "\n"
ASSISTANT_PREFIX = "assistant\n"


class PromptBuilder:
    def __init__(self, tokenizer, cfg: MossTTSConfig) -> None:
        self.tokenizer = tokenizer
        self.cfg = cfg
        # The Rust tokenizer behind transformers' fast one gives the same ids without transformers'
        # per-call Python (_encode_plus, _convert_encoding): the prompt is built in each stream's
        # thread, and 128 text sessions completing a sentence at once built 128 prompts under one
        # GIL, PromptBuilder.build 17% of the GIL's time on the H200 (perf/RESULTS.md, issue 31).
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # The fields block (language, instruction, duration...) repeats across requests: once each.
        self._fields_ids = functools.lru_cache(maxsize=256)(lambda text: tuple(self._encode(text)))
        # Fixed pieces are tokenized once; only the fields block and the texts vary.
        self._prefix = [cfg.im_start_token_id] + self._encode(USER_PREFIX) + self._encode(REFERENCE_HEADER)
        self._none = self._encode(NO_REFERENCE)
        self._suffix = (self._encode(USER_SUFFIX) + [cfg.im_end_token_id] + self._encode(TURN_BREAK)
                        + [cfg.im_start_token_id] + self._encode(ASSISTANT_PREFIX) + [cfg.audio_start_token_id])

    def _encode(self, text: str) -> list[int]:
        if self._backend is not None:
            # encode_batch, not encode: the Rust binding tokenizes a batch with the GIL released and
            # a single text holding it (~30 µs for 88 characters, ~120 µs for 400 on the dev box).
            # A C call that holds the GIL cannot be preempted by the switch interval, so at a wave
            # of 256 requests the engine thread waited out each one; released, they run on other
            # cores beside it. The same ids (tests/test_processor.py).
            return self._backend.encode_batch([text], add_special_tokens=False)[0].ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def text_rows(self, ids: list[int]) -> torch.Tensor:
        rows = np.full((len(ids), self.cfg.row_width), self.cfg.audio_pad_code, dtype=np.int64)
        rows[:, 0] = ids  # numpy: a few µs where two small torch ops took tens under a busy GIL
        return torch.from_numpy(rows)

    def audio_rows(self, codes: torch.Tensor, slot_token: int) -> torch.Tensor:
        rows = torch.empty((codes.shape[0], self.cfg.row_width), dtype=torch.long)
        rows[:, 0] = slot_token
        rows[:, 1:] = codes
        return rows

    def check_codes(self, codes: torch.Tensor) -> torch.Tensor:
        codes = torch.as_tensor(codes)
        n_vq, vocab = self.cfg.n_vq, self.cfg.audio_vocab_size
        if codes.ndim != 2 or codes.shape[1] != n_vq or codes.shape[0] == 0:
            raise PromptError(f"reference codes must have shape [frames>0, {n_vq}], got {list(codes.shape)}")
        if codes.is_floating_point() or codes.dtype == torch.bool:
            raise PromptError(f"reference codes must be integers, got {codes.dtype}")
        if int(codes.min()) < 0 or int(codes.max()) >= vocab:
            raise PromptError(f"reference codes must lie in [0, {vocab}), got [{int(codes.min())}, {int(codes.max())}]")
        return codes.long()

    def build(self, spec: PromptSpec) -> torch.Tensor:
        """PromptSpec -> prompt rows [T, 13] (int64)."""
        if spec.mode not in ("clone", "continuation"):
            raise PromptError(f"mode must be 'clone' or 'continuation', got {spec.mode!r}")
        if not spec.text or not spec.text.strip():
            raise PromptError("text is empty: give the words to speak")
        if len(spec.text) > MAX_TEXT_CHARS:
            raise PromptError(f"text has {len(spec.text)} characters, the limit is {MAX_TEXT_CHARS}")
        codes = None if spec.reference_codes is None else self.check_codes(spec.reference_codes)
        fields = list(self._fields_ids(spec.fields.render()))
        cfg = self.cfg
        if spec.mode == "continuation":
            if codes is None:
                raise PromptError("continuation mode needs reference audio (or reference codes)")
            ref_text = spec.reference_text or ""
            text = ref_text + spec.text if ref_text.strip() else spec.text
            ids = self._prefix + self._none + fields + self._encode(text) + self._suffix
            return torch.cat([self.text_rows(ids), self.audio_rows(codes, cfg.audio_assistant_slot_token_id)])
        if codes is None:
            return self.text_rows(self._prefix + self._none + fields + self._encode(spec.text) + self._suffix)
        return torch.cat([
            self.text_rows(self._prefix + [cfg.audio_start_token_id]),
            self.audio_rows(codes, cfg.audio_user_slot_token_id),
            self.text_rows([cfg.audio_end_token_id] + fields + self._encode(spec.text) + self._suffix),
        ])
