"""The `moss_tts` model's per-request logic: take the engine's code chunks, vocode, send.

One `SpeechStream` per client request, run on a thread of the model's stream pool; the
adapter supplies the engine and the BLS calls through `Children` and the client through
`Client`. Policy lives here so it is tested without Triton:
- streaming: each code chunk is sent as it comes (vocoded first when AUDIO is wanted);
  non-streaming: codes are gathered and sent (vocoded in one call) as one final response;
- continuation: the vocoder is first primed with the reference codes (their audio dropped),
  and the reference codes go out once as CONTEXT_CODES;
- cancellation is checked once per chunk (and once a second while a request waits for the
  engine) and stops the engine row and the vocoder sequence; a server shutting down ends its
  streams the same way, with UNAVAILABLE;
- every stream ends with exactly one final response, and the vocoder sequence is always ended.
"""

from __future__ import annotations

import itertools
import logging
import os
from contextlib import closing
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Protocol

import numpy as np

from ..contract import N_VQ, ErrorKind, ServingError, classify, is_shutting_down

log = logging.getLogger(__name__)
NO_CODES = np.zeros((0, N_VQ), np.int32)


class ChildError(ServingError):
    """The engine or a downstream model failed the request; `kind` is what the client is told."""

    @classmethod
    def from_message(cls, message: str) -> "ChildError":
        """A child model's error message as the client should see it (contract.classify); a child
        refused because the server is shutting down says so."""
        kind, _ = classify(message)
        if is_shutting_down(message):
            return cls(f"the server is shutting down; retry (on another replica): {message}", ErrorKind.UNAVAILABLE)
        return cls(message, kind)


@dataclass(frozen=True)
class CodesChunk:
    codes: np.ndarray  # [frames, 12] int32
    context: np.ndarray  # [frames, 12] int32; non-empty only on a continuation's first chunk


class Children(Protocol):
    # Chunks in order; None when nothing came for a while (a chance to check cancellation).
    # Raises ChildError; closing it early ends the request in the engine.
    def stream_codes(self) -> Iterator[Optional[CodesChunk]]: ...
    def abort_codes(self) -> None: ...
    def vocode(self, codes: np.ndarray, start: bool, end: bool) -> np.ndarray: ...  # [2, S]; raises ChildError


class Client(Protocol):
    # One response carrying what the client asked for (audio is None when it did not ask for AUDIO).
    def send(self, audio: Optional[np.ndarray], codes: np.ndarray, context: np.ndarray, final: bool) -> None: ...
    def send_error(self, message: str, kind: ErrorKind) -> None: ...  # always final
    def send_final(self) -> None: ...
    def is_cancelled(self) -> bool: ...


_sequence_ids = itertools.count((int.from_bytes(os.urandom(4), "little") << 24) + 1)


def new_sequence_id() -> int:
    """A correlation id no other live stream uses (uint64, never 0)."""
    return next(_sequence_ids)


class SpeechStream:
    def __init__(self, children: Children, client: Client, stream: bool, wants_audio: bool = True,
                 is_stopping: Callable[[], bool] = lambda: False) -> None:
        self.children = children
        self.client = client
        self.stream = stream
        self.wants_audio = wants_audio
        self.is_stopping = is_stopping  # the server is shutting down: end the stream now
        self._is_vocoder_open = False
        self._gathered: list[np.ndarray] = []
        self._context: Optional[np.ndarray] = None
        self._is_context_sent = False

    def run(self) -> None:
        try:
            ended = self._pump()
            if ended == "done":
                self._finish()
            elif ended == "stopping":
                self.client.send_error("the server is shutting down; retry (on another replica)", ErrorKind.UNAVAILABLE)
            else:
                self.client.send_error("request cancelled by the client", ErrorKind.CANCELLED)
        except ChildError as exc:
            self.client.send_error(str(exc), exc.kind)
        except Exception as exc:  # never leave the client without its final response
            log.exception("speech stream failed")
            self.client.send_error(f"internal error: {exc}", ErrorKind.INTERNAL)
        finally:
            self._close_vocoder()

    def _pump(self) -> str:
        """Consume the engine's chunks: "done", or "cancelled" / "stopping"."""
        with closing(self.children.stream_codes()) as chunks:
            for chunk in chunks:
                ended = "stopping" if self.is_stopping() else "cancelled" if self.client.is_cancelled() else None
                if ended is not None:
                    self.children.abort_codes()
                    return ended
                if chunk is None:
                    continue
                if chunk.context.size:
                    self._context = chunk.context
                if self.stream:
                    self._stream_chunk(chunk.codes)
                else:
                    self._gathered.append(chunk.codes)
        return "done"

    def _take_context(self) -> np.ndarray:
        """The continuation's reference codes on the first response that leaves, else empty."""
        if self._is_context_sent or self._context is None:
            return NO_CODES
        self._is_context_sent = True
        return self._context

    def _open_vocoder(self) -> None:
        """START the sequence; a continuation primes it with the reference frames first."""
        context = self._context if self._context is not None else NO_CODES
        # Open before the call: Triton's sequence batcher holds a slot from the START flag on,
        # even when the call fails, and only END (or its idle timeout) gives it back.
        self._is_vocoder_open = True
        self.children.vocode(context, start=True, end=False)

    def _stream_chunk(self, codes: np.ndarray) -> None:
        if not codes.shape[0]:
            return
        audio = None
        if self.wants_audio:
            if not self._is_vocoder_open and self._context is None:
                # START rides on the first chunk: a round trip through the vocoder's queue less
                # before the first audio (a continuation primes its context first, below).
                # Open before the call, as in _open_vocoder.
                self._is_vocoder_open = True
                audio = self.children.vocode(codes, start=True, end=False)
            else:
                if not self._is_vocoder_open:
                    self._open_vocoder()
                audio = self.children.vocode(codes, start=False, end=False)
        self.client.send(audio, codes, self._take_context(), final=False)

    def _finish(self) -> None:
        if self.stream:
            if self._context is not None and not self._is_context_sent:
                # A continuation that stopped at once still owes the client its context codes.
                self.client.send(np.zeros((2, 0), np.float32) if self.wants_audio else None, NO_CODES,
                                 self._take_context(), final=False)
            # END before the final response: by the time the client has it, the stream's vocoder
            # slot is free (its max_streams place follows as this thread returns), so a client
            # that sends its next request at once is not refused for one it already finished.
            # The price: the final response waits one vocoder round trip.
            self._close_vocoder()
            self.client.send_final()
            return
        codes = np.concatenate(self._gathered) if self._gathered else NO_CODES
        audio = None
        if self.wants_audio:
            if self._context is None:  # one call: START, decode everything, END
                audio = self.children.vocode(codes, start=True, end=True)
            else:
                self._open_vocoder()
                self._is_vocoder_open = False  # this call carries END, whether or not it succeeds
                audio = self.children.vocode(codes, start=False, end=True)
        self.client.send(audio, codes, self._take_context(), final=True)

    def _close_vocoder(self) -> None:
        if not self._is_vocoder_open:
            return
        self._is_vocoder_open = False
        try:
            self.children.vocode(NO_CODES, start=False, end=True)
        except ChildError as exc:  # e.g. shutting down: the vocoder's idle timeout reclaims the slot
            log.warning("closing the vocoder sequence failed: %s", exc)
        except Exception:
            log.exception("closing the vocoder sequence failed")
