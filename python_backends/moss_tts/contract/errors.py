"""What a client is told when a request fails: the error kinds with their "[CODE] message" tags,
`classify()` for any server message (ours, and Triton's own refusals, dead stubs and full queues),
the exceptions that carry a kind, and `error_text`, an exception as the text a client may see.

error_text: libraries put reprs into their messages (soundfile: "Error opening <_io.BytesIO object
at 0x7f58...>: Format not recognised."). A memory address tells a client nothing, differs on every
run (so it defeats grouping errors by text) and shows the server's internals. Every error built
from a caught exception goes through `error_text` instead of `str(exc)`, `{exc}` or `{exc!r}`.
No torch, no Triton: clients import it too.
"""

from __future__ import annotations

import enum
import re
from typing import Optional

class ErrorKind(str, enum.Enum):
    """What went wrong, as the gRPC status code name a client sees at the start of the message."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # the request must change
    UNAVAILABLE = "UNAVAILABLE"  # busy, shutting down or a stage is down: retry (elsewhere)
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"

    def tag(self, message: str) -> str:
        """"[INVALID_ARGUMENT] message": gRPC stream responses carry a message but no status code."""
        return f"[{self.value}] {strip_tag(message)}"


_TAG = re.compile(r"^(in ensemble '[^']*', )?\[([A-Z_]+)\] ")
# Triton's own messages (they carry no tag of ours).
_DEAD_STUB = re.compile(r"Stub process( '[^']*')? is not healthy")
_QUEUE_FULL = re.compile(r"Exceeds maximum queue size")
# A child model of a server that is shutting down (Triton refuses every new inference).
_SHUTTING_DOWN = re.compile(r"Server not ready|server is shutting down", re.IGNORECASE)
# Triton core's rejections of a request that does not match config.pbtxt.
_TRITON_INVALID = re.compile(r"unexpected shape for input|unexpected datatype|inference input '[^']*' data-type is|"
                             r"expected \d+ inputs? but got|unexpected inference input|input byte size mismatch|"
                             r"unexpected (additional )?input|missing required input|has no input named|"
                             r"unknown (input|output)|unexpected inference output", re.IGNORECASE)
_BUSY_WORDS = ("busy", "queue full", "too many", "maximum queue size")


def strip_tag(message: str) -> str:
    """Drop a "[CODE] " tag (and Triton's "in ensemble 'x', ") before re-tagging."""
    return _TAG.sub("", message, count=1)


def classify(message: str) -> tuple[ErrorKind, str]:
    """Any error message from the server -> (kind, text without the tag): our "[CODE] ..." tags,
    and Triton's own messages (dead stub and full queue: UNAVAILABLE; a request that does not
    match the model's inputs: INVALID_ARGUMENT); anything else is INTERNAL."""
    match = _TAG.match(message)
    text = message[match.end():] if match else message
    if _DEAD_STUB.search(message) or _QUEUE_FULL.search(message) or _SHUTTING_DOWN.search(message):
        return ErrorKind.UNAVAILABLE, text
    if match:
        name = "INVALID_ARGUMENT" if match.group(2) == "INVALID_ARG" else match.group(2)
        return (ErrorKind(name) if name in ErrorKind.__members__ else ErrorKind.INTERNAL), text
    if _TRITON_INVALID.search(message):
        return ErrorKind.INVALID_ARGUMENT, text
    return ErrorKind.INTERNAL, text


def is_busy(kind: ErrorKind, text: str) -> bool:
    """UNAVAILABLE because of load (retry later), not because something is down."""
    return kind is ErrorKind.UNAVAILABLE and any(word in text.lower() for word in _BUSY_WORDS)


def is_dead_stub(message: str) -> bool:
    return bool(_DEAD_STUB.search(message))


def is_shutting_down(message: str) -> bool:
    return bool(_SHUTTING_DOWN.search(message))


class ServingError(Exception):
    """A request failed; `kind` is what the client is told."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str, kind: Optional[ErrorKind] = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = ErrorKind(kind)


class InvalidRequest(ServingError, ValueError):
    """Client input that cannot be served; the message says what to fix."""

    kind = ErrorKind.INVALID_ARGUMENT

SHUTTING_DOWN = "the server is shutting down; retry (on another replica)"  # UNAVAILABLE: what the client is told


class ChildError(ServingError):
    """The engine or a downstream model failed the request; `kind` is what the client is told."""

    @classmethod
    def from_message(cls, message: str) -> "ChildError":
        """A child model's error message as the client should see it (classify); a child refused
        because the server is shutting down says so."""
        kind, _ = classify(message)
        if is_shutting_down(message):
            return cls(f"{SHUTTING_DOWN}: {message}", ErrorKind.UNAVAILABLE)
        return cls(message, kind)


# "<_io.BytesIO object at 0x7f58d2c3e4f0>", "<function f.<locals>.g at 0x...>": the text between the
# brackets may hold "<locals>" but no other bracket, so a repr nested in another is matched alone.
_OBJECT_REPR = re.compile(r"<((?:[^<>]|<locals>)+?) at 0x[0-9a-fA-F]+>")


def _type_name(match: re.Match) -> str:
    """'_io.BytesIO object' -> BytesIO; 'function f.<locals>.g' -> function."""
    inner = match.group(1)
    if inner.endswith(" object"):
        return inner.removesuffix(" object").rsplit(".", 1)[-1]
    return inner.split(" ", 1)[0]


def error_text(exc: BaseException, with_type: bool = False) -> str:
    """The message of `exc` with each object repr replaced by its type name (BytesIO); a KeyError's
    key without the quotes str() adds; the type name when there is no message. `with_type` puts
    the type first ("RuntimeError: boom"), for a failure the client did not cause."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)
    text = _OBJECT_REPR.sub(_type_name, text).strip()
    name = type(exc).__name__
    if not text:
        return name
    return f"{name}: {text}" if with_type else text
