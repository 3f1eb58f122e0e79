"""The public `moss_tts` entry's logic: stream codes from the engine, vocode, send audio.

One `SpeechStream` per client request, run inside the BLS adapter's execute,
which supplies the Triton calls through `Children` and the client through `Client`. Policy
lives here so it is tested without Triton:
- streaming: every code chunk is vocoded at once and sent as its own audio response;
  non-streaming: codes are gathered and vocoded in one call, sent as one response;
- continuation: the vocoder is first primed with the reference codes (their audio dropped);
- cancellation is checked once per chunk and propagated to the engine (ABORT) and the vocoder
  (END), since Triton 24.10 does not cancel BLS children;
- every stream ends with exactly one final response, and the vocoder state is always ended.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Protocol

import numpy as np

log = logging.getLogger(__name__)
N_VQ = 12


class ChildError(Exception):
    """A downstream model answered with an error; `code` is its Triton error code name."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class CodesChunk:
    codes: np.ndarray  # [frames, 12] int32
    context: np.ndarray  # [frames, 12] int32; non-empty only on a continuation's first chunk


class Children(Protocol):
    def stream_codes(self) -> Iterator[CodesChunk]: ...  # raises ChildError
    def abort_codes(self) -> None: ...
    def vocode(self, codes: np.ndarray, start: bool, end: bool) -> np.ndarray: ...  # [2, S]; raises ChildError


class Client(Protocol):
    def send_audio(self, audio: np.ndarray, final: bool) -> None: ...
    def send_error(self, message: str, code: str) -> None: ...  # always final
    def send_final(self) -> None: ...
    def is_cancelled(self) -> bool: ...


_sequence_ids = itertools.count((int.from_bytes(os.urandom(4), "little") << 24) + 1)


def new_sequence_id() -> int:
    """A correlation id no other live stream uses (uint64, never 0)."""
    return next(_sequence_ids)


class SpeechStream:
    def __init__(self, children: Children, client: Client, stream: bool) -> None:
        self.children = children
        self.client = client
        self.stream = stream
        self._is_vocoder_open = False
        self._gathered: list[np.ndarray] = []
        self._context: Optional[np.ndarray] = None

    def run(self) -> None:
        try:
            if self._pump():
                self._finish()
            else:
                self.client.send_error("request cancelled by the client", "cancelled")
        except ChildError as exc:
            self.client.send_error(str(exc), exc.code)
        except Exception as exc:  # never leave the client without its final response
            log.exception("speech stream failed")
            self.client.send_error(f"internal error: {exc}", "internal")
        finally:
            self._close_vocoder()

    def _pump(self) -> bool:
        """Consume the engine's chunks; False if the client cancelled (checked once per chunk)."""
        for chunk in self.children.stream_codes():
            if self.client.is_cancelled():
                self.children.abort_codes()
                return False
            if chunk.context.size:
                self._context = chunk.context
            if self.stream:
                self._stream_chunk(chunk.codes)
            else:
                self._gathered.append(chunk.codes)
        return True

    def _open_vocoder(self) -> None:
        """START the sequence; a continuation primes it with the reference frames first."""
        context = self._context if self._context is not None else np.zeros((0, N_VQ), np.int32)
        self.children.vocode(context, start=True, end=False)
        self._is_vocoder_open = True

    def _stream_chunk(self, codes: np.ndarray) -> None:
        if not codes.shape[0]:
            return
        if not self._is_vocoder_open:
            self._open_vocoder()
        self.client.send_audio(self.children.vocode(codes, start=False, end=False), final=False)

    def _finish(self) -> None:
        if self.stream:
            self.client.send_final()
            return
        codes = np.concatenate(self._gathered) if self._gathered else np.zeros((0, N_VQ), np.int32)
        self._open_vocoder()
        audio = self.children.vocode(codes, start=False, end=True)
        self._is_vocoder_open = False
        self.client.send_audio(audio, final=True)

    def _close_vocoder(self) -> None:
        if not self._is_vocoder_open:
            return
        self._is_vocoder_open = False
        try:
            self.children.vocode(np.zeros((0, N_VQ), np.int32), start=False, end=True)
        except Exception:  # the idle timeout reclaims the slot if even this fails
            log.exception("closing the vocoder sequence failed")
