"""error_text: an exception as the text a client may see in an error message.

Libraries put reprs into their messages (soundfile: "Error opening <_io.BytesIO object at
0x7f58...>: Format not recognised."). A memory address tells a client nothing, differs on every
run (so it defeats grouping errors by text) and shows the server's internals. Every error built
from a caught exception goes through `error_text` instead of `str(exc)`, `{exc}` or `{exc!r}`.
"""

from __future__ import annotations

import re

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
