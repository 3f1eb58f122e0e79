"""The WebSocket's wire rules (docs/websocket.md) shared by the connection and its contexts: close
codes, the error event, context ids, and the per-context errors of the contexts protocol.

An error naming a context never closes the socket: it is an `error` event carrying `context_id`
(issue 32: other contexts go on). Only protocol violations close it (`ProtocolViolation`).
"""

from __future__ import annotations

import re
from typing import Optional

from fastapi import WebSocketDisconnect

from .errors import ApiError, bad_request

# Close codes (RFC 6455): 1000 done or cancelled, 1008 a protocol violation or a limit, 1003 a binary
# frame from the client, 1011 the synthesis failed, 1013 the TTS server is unavailable.
NORMAL, UNSUPPORTED_DATA, POLICY, SERVER_ERROR, TRY_LATER = 1000, 1003, 1008, 1011, 1013
# ElevenLabs' and Cartesia's ids are free strings; these characters keep them safe in logs and URLs.
CONTEXT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
# What a send raises once the client is gone (Starlette: RuntimeError after a close, the server's
# transport: OSError, newer Starlette: WebSocketDisconnect).
SOCKET_GONE = (OSError, RuntimeError, WebSocketDisconnect)
MESSAGE_TYPES = ("options", "text", "flush", "end", "cancel", "close_socket")


class ProtocolViolation(Exception):
    """Close the connection with `code` and this message as the reason."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


def close_code(exc: ApiError) -> int:
    """How the socket closes after the default context failed with `exc`."""
    return TRY_LATER if exc.status in (429, 503) else SERVER_ERROR if exc.status >= 500 else POLICY


def error_event(exc: ApiError, context_id: Optional[str] = None) -> dict:
    named = {} if context_id is None else {"context_id": context_id}
    return {"type": "error", **named, "status": exc.status, **exc.body()}


def is_context_id(value: object) -> bool:
    return isinstance(value, str) and CONTEXT_ID.fullmatch(value) is not None


def invalid_context_id(value: object) -> ApiError:
    return bad_request(f"context_id must be a string of 1-64 characters from A-Z a-z 0-9 _ . : -, got {value!r}",
                       "context_id", code="invalid_context_id")


def unknown_context(context_id: str, kind: str) -> ApiError:
    return bad_request(f"context {context_id!r} was never opened: {kind!r} ignored (open it with options or text)",
                       "context_id", code="unknown_context")


def context_exists(context_id: str) -> ApiError:
    return bad_request(f"context {context_id!r} is open already: its options cannot change", "context_id",
                       code="context_exists")


def context_ended(context_id: str, kind: str) -> ApiError:
    return bad_request(f"context {context_id!r} has ended (ids are not reused on a socket): {kind!r} ignored",
                       "context_id", code="context_ended")


def too_many_contexts(limit: int) -> ApiError:
    return ApiError(429, f"{limit} contexts are open on this socket already (--ws-max-contexts): end or cancel "
                         f"one first", type="rate_limit_error", param="context_id", code="too_many_contexts")


def input_ended(kind: str) -> ApiError:
    return bad_request(f"the input has ended: {kind!r} after 'end' is ignored", "type", code="input_ended")


def unknown_type(kind: object) -> ApiError:
    return bad_request(f"unknown message type {kind!r}: use {', '.join(MESSAGE_TYPES[1:])}", "type",
                       code="unknown_message_type")
