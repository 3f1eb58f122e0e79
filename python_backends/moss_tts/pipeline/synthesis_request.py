"""One synthesis request as the Triton models receive it: named tensors -> validated objects.

Used by the `moss_tts` adapter, which rejects bad input with these messages before anything
runs. Names, defaults and limits come from `moss_tts.contract`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

from ..contract.errors import InvalidRequest
from ..contract.prompt_fields import PromptError, PromptFields, PromptSpec, parse_tokens, split_token_prefix
from ..contract.sampling_options import SAMPLING_OPTIONS
from ..contract.sampling_params import ChannelParams, SamplingError, SamplingParams
from ..contract.tensors import (DEFAULT_MAX_FRAMES, MAX_CHUNK_FRAMES, MAX_REQUEST_ID_CHARS, MAX_SESSION_ID_CHARS,
                                MAX_TEXT_CHARS, MODES)


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    fields: PromptFields
    reference_text: Optional[str]
    mode: str
    params: SamplingParams
    stream: bool
    first_chunk_frames: Optional[int]
    chunk_frames: Optional[int]
    request_id: str
    is_max_frames_given: bool = False  # else the length is what fits, at most DEFAULT_MAX_FRAMES

    def prompt_spec(self, reference_codes) -> PromptSpec:
        return PromptSpec(self.text, self.fields, reference_codes, self.reference_text, self.mode)

    def with_request_id(self, request_id: str) -> "SynthesisRequest":
        return replace(self, request_id=request_id)

    def params_for(self, prompt_rows: int, max_seq_len: int) -> SamplingParams:
        """The sampling parameters with a length that fits the engine's row budget: prompt rows +
        frames <= max_seq_len. The default length shrinks to fit; an explicit MAX_FRAMES or
        TOKENS that cannot fit is refused with the numbers."""
        room = max_seq_len - prompt_rows
        if room < 1:
            raise InvalidRequest(f"the prompt takes {prompt_rows} rows and this server's max_seq_len is {max_seq_len}: "
                                 f"shorten the text, instructions or reference")
        asked = [(name, value) for name, value in (("MAX_FRAMES", self.params.max_frames if self.is_max_frames_given
                                                   else None), ("TOKENS", self.fields.tokens)) if value is not None]
        for name, value in asked:
            if value > room:
                raise InvalidRequest(f"input {name} {value} does not fit: the prompt takes {prompt_rows} of this "
                                     f"server's {max_seq_len} rows (max_seq_len); ask for at most {room} frames "
                                     f"or shorten the text, instructions or reference")
        if self.is_max_frames_given:
            return self.params
        return replace(self.params, max_frames=min(self.params.max_frames, room))


Getter = Callable[[str], Optional[np.ndarray]]


@dataclass(frozen=True)
class SessionInputs:
    session_id: str
    is_end: bool  # SESSION_END: the session ends after this request
    has_text: bool  # False: a SESSION_END alone (TEXT empty)
    index: Optional[int] = None  # SESSION_INDEX: the request's place in the session (None: by arrival)


def parse_session_inputs(get: Getter) -> Optional[SessionInputs]:
    """SESSION_ID / SESSION_END / SESSION_INDEX, or None for a request outside any text session."""
    session_id = _string(get, "SESSION_ID")
    is_end = bool(_scalar(get, "SESSION_END") or False)
    if session_id is None:
        if is_end or get("SESSION_INDEX") is not None:
            raise InvalidRequest(f"{'SESSION_END' if is_end else 'SESSION_INDEX'} needs SESSION_ID: the session it belongs to")
        return None
    if not session_id or len(session_id) > MAX_SESSION_ID_CHARS or not session_id.isprintable():
        raise InvalidRequest(f"input SESSION_ID must be 1 to {MAX_SESSION_ID_CHARS} printable characters, got "
                             f"{session_id[:MAX_SESSION_ID_CHARS + 1]!r}")
    text = _string(get, "TEXT")
    has_text = bool(text and text.strip())
    if not has_text and not is_end:
        raise InvalidRequest("input TEXT is empty: give the words to speak (an empty TEXT only with SESSION_END)")
    index = _scalar(get, "SESSION_INDEX")
    if index is not None and not 0 <= int(index) < 2**31 - 1:
        raise InvalidRequest(f"input SESSION_INDEX must be 0, 1, 2, ... (the request's place in its session), got {index}")
    return SessionInputs(session_id, is_end, has_text, None if index is None else int(index))


def parse_stop_input(get: Getter, names) -> Optional[str]:
    """STOP: the id of a running request to end (a request of its own, on the same stream), or None
    for any other request. A STOP request carries nothing else but an empty TEXT (TEXT is required
    by the model's config)."""
    stop = _string(get, "STOP")
    if stop is None:
        return None
    others = sorted(set(names) - {"STOP", "TEXT"})
    if others:
        raise InvalidRequest(f"a STOP request carries only STOP and an empty TEXT; it also has {', '.join(others)}: "
                             f"send those in a request of their own")
    if (_string(get, "TEXT") or "").strip():
        raise InvalidRequest("a STOP request's TEXT must be empty: it speaks nothing, it ends the request STOP names")
    stop = stop.strip()
    if not stop or len(stop) > MAX_REQUEST_ID_CHARS or not stop.isprintable():
        raise InvalidRequest(f"input STOP must be the id of the request to end (1 to {MAX_REQUEST_ID_CHARS} printable "
                             f"characters, the request's gRPC id), got {stop[:MAX_REQUEST_ID_CHARS + 1]!r}")
    return stop


def _scalar(get: Getter, name: str):
    value = get(name)
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1:
        raise InvalidRequest(f"input {name} must hold exactly one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def _string(get: Getter, name: str) -> Optional[str]:
    value = _scalar(get, name)
    if value is None:
        return None
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"input {name} is not valid UTF-8") from None
    return str(value)


def _number(get: Getter, name: str, kind, default):
    value = _scalar(get, name)
    if value is None:
        return default
    if isinstance(value, (bytes, np.bytes_, str)):
        raise InvalidRequest(f"input {name} must be numeric, got a string")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidRequest(f"input {name} must be a finite number, got {number}")
    if kind is int and number != int(number):
        raise InvalidRequest(f"input {name} must be an integer, got {number}")
    return kind(number)


def _chunk(get: Getter, name: str) -> Optional[int]:
    value = _number(get, name, int, None)
    if value is not None and not (1 <= value <= MAX_CHUNK_FRAMES):
        raise InvalidRequest(f"input {name} must be in [1, {MAX_CHUNK_FRAMES}] frames, got {value}")
    return value


def _channel(get: Getter, channel: str) -> ChannelParams:
    """One channel's sampling options (sampling_options.py): each from its input, or its default."""
    return ChannelParams(**{o.name: _number(get, o.input_name(channel), o.kind, o.default(channel))
                            if o.has_input(channel) else o.default(channel) for o in SAMPLING_OPTIONS})


def parse_synthesis_request(get: Getter, default_request_id: str) -> SynthesisRequest:
    """Read and validate every synthesis input; `get(name)` returns the tensor or None."""
    text = _string(get, "TEXT")
    if text is None:
        raise InvalidRequest("input TEXT is required")
    try:
        inline_tokens, text = split_token_prefix(text)
        tokens = _number(get, "TOKENS", int, None)
        tokens = parse_tokens(tokens, "input TOKENS") if tokens is not None else inline_tokens
    except PromptError as exc:
        raise InvalidRequest(str(exc)) from None
    if not text.strip():
        raise InvalidRequest("input TEXT is empty: give the words to speak")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidRequest(f"input TEXT has {len(text)} characters, the limit is {MAX_TEXT_CHARS}")
    mode_name = (_string(get, "MODE") or "clone").strip().lower()
    if mode_name not in MODES:
        raise InvalidRequest(f"input MODE must be one of {sorted(MODES)}, got {mode_name!r}")
    language = _string(get, "LANGUAGE")
    if language is not None and language.strip().lower() == "auto":
        language = None  # "auto" means: let the model infer it (no Language field)
    max_frames = _number(get, "MAX_FRAMES", int, None)
    try:
        params = SamplingParams(
            audio=_channel(get, "audio"),
            stop=_channel(get, "stop"),
            seed=_number(get, "SEED", int, None),
            max_frames=DEFAULT_MAX_FRAMES if max_frames is None else max_frames,
            ignore_stop=bool(_scalar(get, "IGNORE_STOP") or False),
        )
    except SamplingError as exc:
        raise InvalidRequest(str(exc)) from None
    stream = _scalar(get, "STREAM")
    return SynthesisRequest(
        text=text,
        fields=PromptFields(instruction=_string(get, "INSTRUCTIONS"), tokens=tokens, language=language),
        reference_text=_string(get, "REFERENCE_TEXT"),
        mode=MODES[mode_name],
        params=params,
        stream=True if stream is None else bool(stream),
        first_chunk_frames=_chunk(get, "FIRST_CHUNK_FRAMES"),
        chunk_frames=_chunk(get, "CHUNK_FRAMES"),
        request_id=(_string(get, "REQUEST_ID") or "").strip() or default_request_id,
        is_max_frames_given=max_frames is not None,
    )
