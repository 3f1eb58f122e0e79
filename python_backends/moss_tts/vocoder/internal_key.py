"""The key that marks a request as the pipeline's own (moss_tts -> vocoder).

The vocoder is callable by any gRPC client, and such direct callers share a bounded quota of
codec slots so they can never take the slots moss_tts needs. moss_tts proves it is moss_tts
with this key, sent as a BLS request parameter. Every model of one server must hold the same
key: it comes from MOSS_TTS_INTERNAL_KEY (scripts/serve.sh sets a random one per start) or, for
a tritonserver started by hand, from a file named after the server's pid (every stub is a child
of tritonserver), created once, atomically, readable only by its owner. No Triton import.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import tempfile
from pathlib import Path

ENV = "MOSS_TTS_INTERNAL_KEY"
PARAMETER = "moss_internal_key"


def internal_key(directory: str | None = None) -> str:
    key = os.environ.get(ENV, "").strip()
    return key or _server_key_file(Path(directory or tempfile.gettempdir()) / f"moss-tts-internal-key-{os.getppid()}")


def _server_key_file(path: Path) -> str:
    if not path.exists():
        scratch = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(scratch, path)  # atomic: the first model to get here wins, the others read its key
        except FileExistsError:
            pass
        finally:
            os.unlink(scratch)
    return path.read_text().strip()


def parameters(key: str) -> dict[str, str]:
    """BLS request parameters that mark a request as internal."""
    return {PARAMETER: key}


def is_internal(parameters_json: str, key: str) -> bool:
    """Does a received request (its parameters() JSON) carry the key?"""
    try:
        value = json.loads(parameters_json or "{}").get(PARAMETER, "")
    except (ValueError, AttributeError):
        return False
    return isinstance(value, str) and hmac.compare_digest(value.encode(), key.encode())
