"""What a request asks the prompt to say: text, the fields block, reference, mode (no torch).

The Triton entry validates requests with these before anything heavy is imported; the
processor (prompt rows) builds on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .tensors import MAX_FRAMES, MAX_TEXT_CHARS  # noqa: F401 (MAX_TEXT_CHARS: processor's check)

if TYPE_CHECKING:
    import torch

# `${token:N}` at the very start of the text sets the duration (SGLang-Omni's inline form).
TOKEN_PREFIX = re.compile(r"^\s*\$\{token:\s*([^}]*)\}")


class PromptError(ValueError):
    """The request cannot be turned into a prompt; the message says what to fix."""


@dataclass(frozen=True)
class PromptFields:
    """The fields block between the reference and the text. None renders as `None`."""

    instruction: Optional[str] = None
    tokens: Optional[int] = None
    quality: Optional[str] = None
    sound_event: Optional[str] = None
    ambient_sound: Optional[str] = None
    language: Optional[str] = None

    def render(self) -> str:
        def value(v) -> str:
            text = "" if v is None else str(v).strip()
            return text or "None"
        return ("\n- Instruction:\n" + value(self.instruction)
                + "\n- Tokens:\n" + value(self.tokens)
                + "\n- Quality:\n" + value(self.quality)
                + "\n- Sound Event:\n" + value(self.sound_event)
                + "\n- Ambient Sound:\n" + value(self.ambient_sound)
                + "\n- Language:\n" + value(self.language)
                + "\n- Text:\n")


@dataclass(frozen=True)
class PromptSpec:
    """What to say and how. mode: "clone" (reference codes in the user turn, or plain TTS
    without a reference) or "continuation" (reference transcript + text, reference codes as
    the start of the assistant's audio)."""

    text: str
    fields: PromptFields = PromptFields()
    reference_codes: Optional["torch.Tensor"] = None  # [frames, 12] int
    reference_text: Optional[str] = None
    mode: str = "clone"


def split_token_prefix(text: str) -> tuple[Optional[int], str]:
    """`${token:N}rest` -> (N, rest); text without the prefix -> (None, text)."""
    match = TOKEN_PREFIX.match(text)
    if match is None:
        return None, text
    return parse_tokens(match.group(1), "${token:N} prefix"), text[match.end():]


def parse_tokens(value, where: str = "tokens") -> int:
    try:
        tokens = int(str(value).strip())
    except ValueError:
        raise PromptError(f"{where} must be a positive integer number of frames (12.5 per second), "
                          f"got {value!r}") from None
    if tokens <= 0 or tokens > MAX_FRAMES:
        raise PromptError(f"{where} must be in [1, {MAX_FRAMES}] frames (12.5 per second), got {tokens}")
    return tokens
