"""SessionRequest: one request of a text session (registry.py), run on a stream thread.

It waits for its turn (the session's earlier requests done), speaks its segment through a
SpeechStream whose children and client are the session's: the codes carry the session's voice
(SessionCodes), the vocoder calls continue the session's one sequence (SessionChildren: START on
the session's first call only, END only when the session ends or this request fails), and the
client's final response of a SESSION_END request goes out after the session is freed
(SessionClient). A cancel or failure of any request closes the whole session. No Triton import.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..contract.errors import SHUTTING_DOWN, ErrorKind
from ..contract.tensors import N_VQ
from ..pipeline.speech_stream import SpeechStream
from ..pipeline.stream_ports import CodesChunk, Ready
from .registry import SessionRegistry, TextSession

NO_AUDIO = np.zeros((2, 0), np.float32)


class SessionCodes:
    """A request's code chunks; the session's first request lends its first frames to the voice."""

    def __init__(self, inner, session: TextSession, is_first: bool) -> None:
        self.inner = inner  # EngineCodes or SegmentedCodes
        self.session = session
        self.is_first = is_first

    def wake(self) -> None:
        self.inner.wake()

    def abort(self) -> None:
        self.inner.abort()

    def chunks(self):
        for chunk in self.inner.chunks():
            if self.is_first and isinstance(chunk, CodesChunk) and self.session.reference is None:
                self.session.voice.add(chunk.codes)
            yield chunk


def first_reference(session: TextSession, reference: Callable[[], Optional[np.ndarray]]):
    """The first request's reference callable, keeping what it returns as the session's voice."""
    def get():
        codes = reference()
        if codes is not None and np.size(codes):
            session.reference = np.asarray(codes, dtype=np.int32).reshape(-1, N_VQ)
        return codes
    return get


class SessionChildren:
    """A request's children on the session's vocoder sequence."""

    def __init__(self, inner, session: TextSession, is_last: bool, client: "SessionClient") -> None:
        self.inner = inner
        self.session = session
        self.is_last = is_last
        self.client = client

    def stream_codes(self):
        return self.inner.stream_codes()

    def abort_codes(self):
        self.inner.abort_codes()

    def vocode(self, codes, start, end, deadline=None):
        # END only when the session ends here (SESSION_END, or this request failed: the session
        # closes); a segment's own closing call is answered with no audio.
        end = end and (self.is_last or self.client.failed is not None)
        if not codes.shape[0] and not (end and self.session.is_vocoder_open):
            return Ready(NO_AUDIO)  # no frames, nothing to close
        pending = self.inner.vocode(codes, start=not self.session.is_vocoder_open, end=end, deadline=deadline)
        self.session.is_vocoder_open = not end
        return pending


class SessionClient:
    """The request's client; remembers a failure, frees the session before a SESSION_END's final."""

    def __init__(self, inner, on_final: Callable[[], None]) -> None:
        self.inner = inner
        self.on_final = on_final
        self.failed: Optional[ErrorKind] = None

    def send(self, audio, codes, context, final):
        if final:
            self.on_final()
        self.inner.send(audio, codes, context, final)

    def send_error(self, message, kind):
        self.failed = ErrorKind(kind)
        self.inner.send_error(message, kind)

    def send_final(self):
        self.on_final()
        self.inner.send_final()

    def is_cancelled(self):
        return self.inner.is_cancelled()


class SessionRequest:
    def __init__(self, registry: SessionRegistry, session: TextSession, ticket: int,
                 stream: Optional[SpeechStream], client: SessionClient,
                 is_stopping: Callable[[], bool] = lambda: False) -> None:
        self.registry = registry
        self.session = session
        self.ticket = ticket
        self.stream = stream  # None: a SESSION_END without text
        self.client = client
        self.is_stopping = is_stopping

    def run(self) -> None:
        outcome = "failed"
        try:
            if not self.session.wait_turn(self.ticket, lambda: self.client.is_cancelled() or self.is_stopping()):
                self._refuse()
            elif self.stream is not None:
                self.stream.run()  # sends exactly one final response
            else:
                self.client.send_final()
            failed = self.client.failed
            outcome = None if failed is None else "cancelled" if failed is ErrorKind.CANCELLED else "failed"
        finally:
            self.registry.finish(self.session, outcome)

    def _refuse(self) -> None:
        closed = self.session.closed
        if self.is_stopping():
            self.client.send_error(SHUTTING_DOWN, ErrorKind.UNAVAILABLE)
        elif self.client.is_cancelled() or closed == "cancelled":
            self.client.send_error(f"request cancelled (text session {self.session.session_id!r})",
                                   ErrorKind.CANCELLED)
        else:
            self.client.send_error(f"text session {self.session.session_id!r} closed ({closed}) before this "
                                   f"request's turn; start a new session", ErrorKind.INVALID_ARGUMENT)
