"""The ports of a SpeechStream (speech_stream.py): what it takes in (the engine's code chunks, the
vocoder's pending audio) and what it sends out (a Client), as protocols the Triton side
(serving/stream_io.py), text sessions and the tests implement. No Triton import."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Protocol

import numpy as np

from ..contract.errors import ErrorKind
from ..contract.tensors import N_VQ

NO_CODES = np.zeros((0, N_VQ), np.int32)


@dataclass(frozen=True)
class CodesChunk:
    codes: np.ndarray  # [frames, 12] int32
    context: np.ndarray  # [frames, 12] int32; non-empty only on a continuation's first chunk
    # time.monotonic() of its request's entry into the engine's queue and of the engine's first
    # codes for it (0: not known): only the first-audio trace reads them.
    queued_at: float = 0.0
    first_codes_at: float = 0.0


class Pending(Protocol):
    """The audio of one vocoder call, to come."""
    def done(self) -> bool: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...  # True once done
    def result(self, timeout: Optional[float] = None) -> np.ndarray: ...  # [2, S]; raises ChildError
    def cancel(self) -> None: ...  # the audio is no longer wanted
    def hurry(self) -> None: ...  # the audio is wanted now (its stream waits for it to end)


class Ready:
    """A vocoder call that completed when it was made (a synchronous child: BLS)."""

    def __init__(self, audio: np.ndarray) -> None:
        self.audio = audio

    def done(self) -> bool:
        return True

    def wait(self, timeout: Optional[float] = None) -> bool:
        return True

    def result(self, timeout: Optional[float] = None) -> np.ndarray:
        return self.audio

    def cancel(self) -> None:
        pass

    def hurry(self) -> None:
        pass


# Yielded by a chunk iterator when a Pending of its stream completed: send what is ready.
AUDIO_READY = object()


class Children(Protocol):
    # Chunks in order; None when nothing came for a while (a chance to check cancellation),
    # AUDIO_READY when a vocoder call of this stream completed. Raises ChildError; closing it
    # early ends the request in the engine.
    def stream_codes(self) -> Iterator[object]: ...
    def abort_codes(self) -> None: ...
    # One call of the stream's vocoder sequence, in order, its audio due by `deadline`
    # (time.monotonic(); None = now); raises ChildError when refused at once.
    def vocode(self, codes: np.ndarray, start: bool, end: bool, deadline: Optional[float] = None) -> Pending: ...


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
