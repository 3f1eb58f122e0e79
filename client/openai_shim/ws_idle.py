"""IdleTimer: the WebSocket's idle timeout (--ws-idle-timeout, or the socket's `inactivity_timeout`).

It counts from the last client message, or from the moment the last context that had its `end`
finished speaking, whichever is later; while such a context is still speaking (the audio's turn:
the client has nothing more to say) it does not count. A running wait is moved when that changes
(`rearm`), so a socket whose last answer just ended gets the whole timeout again.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Optional, TypeVar

from .ws_protocol import POLICY, ProtocolViolation

T = TypeVar("T")


class IdleTimer:
    def __init__(self, timeout_s: float, flag: str, is_audio_turn: Callable[[], bool]):
        self.timeout_s = timeout_s
        self.flag = flag  # named in the close reason
        self.is_audio_turn = is_audio_turn
        self._quiet_since = asyncio.get_running_loop().time()
        self._running: Optional[asyncio.Timeout] = None

    def deadline(self) -> Optional[float]:
        return None if self.is_audio_turn() else self._quiet_since + self.timeout_s

    async def wait(self, awaitable: Awaitable[T]) -> T:
        """`awaitable`'s result (a client message), or ProtocolViolation once the socket is idle."""
        try:
            async with asyncio.timeout_at(self.deadline()) as self._running:  # no task per message
                result = await awaitable
        except TimeoutError:
            raise ProtocolViolation(POLICY, f"no message for {self.timeout_s:g} s ({self.flag})") from None
        finally:
            self._running = None
        self._quiet_since = asyncio.get_running_loop().time()
        return result

    def rearm(self, audio_ended: bool) -> None:
        """A context ended; `audio_ended`: it had its end, so its audio's turn is over."""
        if audio_ended and not self.is_audio_turn():
            self._quiet_since = asyncio.get_running_loop().time()
        if self._running is not None:
            self._running.reschedule(self.deadline())
