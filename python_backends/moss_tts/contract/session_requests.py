"""SessionRequests: the requests of one text session, as a client sends them.

Both clients of text sessions (client/tts_client.TextSession over gRPC, the shim's WebSocket)
send them by these rules, which `moss_tts` holds a session to (sessions/admission.py):
every request names the SESSION_ID; the voice inputs (contract.SESSION_VOICE_INPUTS) go with the
first request only, the other options with every request that carries text; the last request
carries SESSION_END, and is an extra one with empty TEXT (and no options) when no text is left.
Request ids are `<prefix><k>` for segment k and `<prefix>end` for that empty closing request,
so each response names its segment. Every request carries SESSION_INDEX, its place in the session
(k, and the number of segments for the closing request), so that a server with several moss_tts
instances speaks them in order even when a relayed one arrives late. Option names are matched case-insensitively (the gRPC
client takes lower-case keywords, the shim input names).
"""

from __future__ import annotations

from typing import Mapping, Optional

from .tensors import SESSION_VOICE_INPUTS


class SessionRequests:
    def __init__(self, options: Mapping[str, object], id_prefix: str = "") -> None:
        self.voice = {k: v for k, v in options.items() if k.upper() in SESSION_VOICE_INPUTS}
        self.options = {k: v for k, v in options.items() if k.upper() not in SESSION_VOICE_INPUTS}
        self.id_prefix = id_prefix
        self.segments: list[str] = []  # the texts sent so far, in order
        self.end_id: Optional[str] = None  # the request that carries SESSION_END, once sent

    def next(self, text: str, is_end: bool = False) -> tuple[str, dict]:
        """The next request's id and its options (the voice with the first request only); call
        it in send order. `text` empty: the closing request (is_end), or a first request."""
        is_first = not self.segments
        if text or is_first:
            options = dict(self.options, **self.voice) if is_first else dict(self.options)
        else:
            options = {}
        options["SESSION_INDEX"] = len(self.segments)
        request_id = f"{self.id_prefix}{len(self.segments)}" if text else f"{self.id_prefix}end"
        if is_end:
            self.end_id = request_id
        if text:
            self.segments.append(text)
        return request_id, options

    def segment_of(self, request_id: str) -> Optional[int]:
        """The segment a response's request id names; None for the closing request."""
        tail = request_id[len(self.id_prefix):]
        return None if tail == "end" else int(tail)
