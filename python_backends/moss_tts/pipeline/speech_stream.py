"""The `moss_tts` model's per-request logic: take the engine's code chunks, vocode, send.

One `SpeechStream` per client request, run on a thread of the model's stream pool; the
adapter supplies the engine and the vocoder through `Children` and the client through
`Client`. Policy lives here so it is tested without Triton:
- streaming: each code chunk goes to the vocoder as it comes and the stream takes the next one
  at once: any number of chunks can be in flight (`Children.vocode` returns a `Pending`), and
  their audio is sent in order as each completes (the vocoder wakes the stream through its
  chunk iterator, `AUDIO_READY`); non-streaming: codes are gathered and vocoded as one job,
  sent as one final response (vocoding each chunk as it came was measured slower: its rounds
  slowed the engine's steps, perf/RESULTS.md, issue 34's fourth round);
- continuation: the vocoder is first primed with the reference codes (their audio dropped),
  and the reference codes go out once as CONTEXT_CODES;
- cancellation is checked at a chunk when `cancel_poll_s` has passed since the last check (and
  once a second while a request waits for the engine or the vocoder) and stops the engine row,
  drops the chunks in flight and ends the vocoder sequence; a server shutting down ends its
  streams the same way, with UNAVAILABLE;
- every stream ends with exactly one final response, and the vocoder sequence is always ended;
- with `forward_chunks` (a plain streamed request with the in-process vocoder), the engine's
  thread hands each chunk to the vocoder as it delivers it (chunk_forwarder.py): the stream
  thread wakes to send audio only, and checks for a cancel then.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from contextlib import closing
from typing import Callable, Optional

import numpy as np

from ..contract.errors import SHUTTING_DOWN, ChildError, ErrorKind, error_text
from .chunk_forwarder import ChunkForwarder
from .first_audio_trace import FirstAudioTrace
from .playback import Playback
from .stream_ports import AUDIO_READY, NO_CODES, Children, Client, Pending

log = logging.getLogger(__name__)
WAIT_S = 1.0  # how often a stream waiting for the vocoder checks for a cancel
END_WAIT_S = 10.0  # the longest a stream waits for its END to be taken (then the idle timeout frees it)
# A client's cancel is an IPC round trip to tritonserver (the GIL given up and won back) per check:
# 4.1% of the GIL in the H200 soak when made at every chunk (issue 34). A stream's first chunks
# come 2, 4 and 8 steps apart, 40-300 ms at the served pace, in the very steps that admit a wave,
# so they are checked at most this often; later chunks are further apart than this anyway, so a
# cancel is still seen within a chunk or this long.
CANCEL_POLL_S = 0.25


class SpeechStream:
    def __init__(self, children: Children, client: Client, stream: bool, wants_audio: bool = True,
                 is_stopping: Callable[[], bool] = lambda: False, trace: Optional[FirstAudioTrace] = None,
                 playback: Optional[Playback] = None, cancel_poll_s: float = CANCEL_POLL_S,
                 forward_chunks: bool = False) -> None:
        self.children = children
        self.client = client
        self.stream = stream
        self.wants_audio = wants_audio
        self.is_stopping = is_stopping  # the server is shutting down: end the stream now
        self._is_vocoder_open = False
        # Vocoder calls not yet answered, in order, with the codes their audio is sent with
        # (None: a prime or a non-streamed call, nothing to send by itself).
        self._in_flight: deque[tuple[Pending, Optional[np.ndarray]]] = deque()
        self._gathered: list[np.ndarray] = []
        self._context: Optional[np.ndarray] = None
        self._is_context_sent = False
        # When the listener's audio runs out: each call's deadline (a text session's requests
        # share the session's Playback: one listener).
        self.playback = playback if playback is not None else Playback()
        self._is_playback_begun = False
        self.trace = trace  # None unless the first-audio trace is on
        self.cancel_poll_s = cancel_poll_s
        self._cancel_checked_at = -float("inf")  # the first chunk is checked
        # Not with the first-audio trace: it marks each chunk's moments on the stream's thread.
        self._forward_chunks = forward_chunks and stream and wants_audio and trace is None
        self._forwarder: Optional[ChunkForwarder] = None
        self._wake: Callable[[], None] = lambda: None
        self._calls = 0  # vocoder calls made through _vocode (the forwarder's failure check reads it)

    def run(self) -> None:
        if self.trace is not None:
            self.trace.mark("thread")
        try:
            # Installed here, not when the stream is made: a stream the pool refuses never runs,
            # and would keep its forwarder's reference back to it (a cycle around its sender).
            self._install_forwarder()
            ended = self._pump()
            if ended is None:
                ended = self._finish()
            if ended == "stopping":
                self.client.send_error(SHUTTING_DOWN, ErrorKind.UNAVAILABLE)
            elif ended == "cancelled":
                self.client.send_error("request cancelled by the client", ErrorKind.CANCELLED)
        except ChildError as exc:
            self.client.send_error(str(exc), exc.kind)
        except Exception as exc:  # never leave the client without its final response
            log.exception("speech stream failed")
            self.client.send_error(f"internal error: {error_text(exc)}", ErrorKind.INTERNAL)
        finally:
            self._close_vocoder()

    def _ended(self) -> Optional[str]:
        self._cancel_checked_at = time.monotonic()
        return "stopping" if self.is_stopping() else "cancelled" if self.client.is_cancelled() else None

    def _ended_at_chunk(self) -> Optional[str]:
        """_ended for a chunk: the client is asked only when `cancel_poll_s` has passed since the last check."""
        if time.monotonic() - self._cancel_checked_at < self.cancel_poll_s:
            return "stopping" if self.is_stopping() else None
        return self._ended()

    def _pump(self) -> Optional[str]:
        """Consume the engine's chunks: None when they are all in, else "cancelled" / "stopping"."""
        with closing(self.children.stream_codes()) as chunks:
            for chunk in chunks:
                # With a forwarder the chunks reach the vocoder unseen here: a cancel is looked
                # for when their audio is ready.
                if chunk is not AUDIO_READY or self._forwarder is not None:
                    ended = self._ended() if chunk is None else self._ended_at_chunk()
                    if ended is not None:
                        self._close_forwarder()
                        self.children.abort_codes()
                        return ended
                    if chunk is not None and chunk is not AUDIO_READY:
                        self._take(chunk)
                self._send_ready(block=False)
        return None

    def _take(self, chunk) -> None:
        if chunk.context.size:
            self._context = chunk.context
        if self.trace is not None and chunk.codes.shape[0]:
            self.trace.codes_read(chunk.queued_at, chunk.first_codes_at)
        if not self.stream:
            self._gathered.append(chunk.codes)
        elif not self.wants_audio:
            if chunk.codes.shape[0]:
                self.client.send(None, chunk.codes, self._take_context(), final=False)
        elif chunk.codes.shape[0]:
            self._vocode_chunk(chunk.codes)

    def _take_context(self) -> np.ndarray:
        """The continuation's reference codes on the first response that leaves, else empty."""
        if self._is_context_sent or self._context is None:
            return NO_CODES
        self._is_context_sent = True
        return self._context

    def _vocode(self, codes: np.ndarray, start: bool, end: bool, send: Optional[np.ndarray]) -> Pending:
        # Due when the audio already on its way has played out (a first chunk: now).
        now = time.monotonic()
        if not self._is_playback_begun:
            self._is_playback_begun = True
            self.playback.begin(now)
        pending = self.children.vocode(codes, start=start, end=end, deadline=self.playback.due(now))
        self._calls += 1
        self._in_flight.append((pending, send))
        if send is not None:
            self.playback.submitted(send.shape[0])
        return pending

    def _open_vocoder(self, codes: np.ndarray, send: Optional[np.ndarray], end: bool = False) -> Pending:
        """The sequence's first call(s): START rides on the first chunk (one queue round trip less
        before the first audio); a continuation primes it with the reference frames first."""
        # Open before the call: Triton's sequence batcher holds a slot from the START flag on,
        # even when the call fails, and only END (or its idle timeout) gives it back. A single
        # START|END call (STREAM=false without context) ends the sequence by itself.
        self._is_vocoder_open = self._context is not None or not end
        if self._context is not None:
            self._vocode(self._context, start=True, end=False, send=None)
            return self._vocode(codes, start=False, end=end, send=send)
        return self._vocode(codes, start=True, end=end, send=send)

    def _vocode_chunk(self, codes: np.ndarray) -> Pending:
        """A streamed chunk: the sequence's next call (the first opens it)."""
        if not self._is_vocoder_open:
            return self._open_vocoder(codes, send=codes)
        return self._vocode(codes, start=False, end=False, send=codes)

    def _install_forwarder(self) -> None:
        install = getattr(self.children, "forward_chunks", None) if self._forward_chunks else None
        if install is None:
            return
        forwarder = ChunkForwarder(self._forward_chunk)
        wake = install(forwarder)
        if wake is not None:
            self._forwarder, self._wake = forwarder, wake
        else:
            forwarder.close()  # lets go of this stream

    def _forward_chunk(self, codes: np.ndarray) -> None:
        """The engine's thread, under the forwarder's lock: one chunk to the vocoder."""
        was_open, calls = self._is_vocoder_open, self._calls
        try:
            pending = self._vocode_chunk(codes)
        except BaseException:
            if self._calls == calls:  # nothing queued: the stream's own call of this chunk opens the sequence
                self._is_vocoder_open = was_open
            raise
        # Its audio may have been ready before it was in flight: that wake found nothing to send.
        if pending.done():
            self._wake()

    def _send_ready(self, block: bool) -> Optional[str]:
        """Send the audio of the calls answered so far, in order; with `block`, of all of them.
        Returns "cancelled" / "stopping" if that ends the stream while it waits."""
        if block:  # the stream's codes are all in: none of its calls may wait for company now
            for pending, _ in self._in_flight:
                pending.hurry()
        while self._in_flight:
            pending, codes = self._in_flight[0]
            if not pending.done():
                if not block:
                    return None
                if not pending.wait(WAIT_S):
                    ended = self._ended()
                    if ended is not None:
                        return ended
                    continue
            self._in_flight.popleft()
            audio = pending.result()  # raises the call's ChildError
            if self.trace is not None and codes is not None:
                self.trace.audio_ready(getattr(pending, "launched_at", 0.0), getattr(pending, "finished_at", 0.0))
            if codes is not None:
                self.client.send(audio, codes, self._take_context(), final=False)
                self.playback.sent(time.monotonic())
        return None

    def _close_forwarder(self) -> None:
        """Before the stream ends its sequence or drops its calls: no chunk is handed over after this."""
        if self._forwarder is not None:
            self._forwarder.close()

    def _finish(self) -> Optional[str]:
        self._close_forwarder()  # the engine has delivered every chunk already (Finished came last)
        if self.stream:
            # END goes in behind the last chunk, so the vocoder frees the sequence as soon as that
            # chunk is decoded, and before the final response: by the time the client has it, the
            # stream's slot is free (its max_streams place follows as this thread returns), so a
            # client that sends its next request at once is not refused for one it finished.
            end = self._end_vocoder()
            ended = self._send_ready(block=True)
            if ended is not None:
                return ended
            if self._context is not None and not self._is_context_sent:
                # A continuation that stopped at once still owes the client its context codes.
                self.client.send(np.zeros((2, 0), np.float32) if self.wants_audio else None, NO_CODES,
                                 self._take_context(), final=False)
            self._wait_end(end)
            self.client.send_final()
            return None
        codes = np.concatenate(self._gathered) if self._gathered else NO_CODES
        audio = None
        if self.wants_audio:
            pending = self._open_vocoder(codes, send=None, end=True)  # START, everything, END
            ended = self._send_ready(block=True)
            if ended is not None:
                return ended
            self._is_vocoder_open = False  # its last call carried END
            audio = pending.result()
        self.client.send(audio, codes, self._take_context(), final=True)
        return None

    def _end_vocoder(self) -> Optional[Pending]:
        if not self._is_vocoder_open:
            return None
        self._is_vocoder_open = False
        try:
            return self.children.vocode(NO_CODES, start=False, end=True)
        except ChildError as exc:  # e.g. shutting down: the vocoder's idle timeout reclaims the slot
            log.warning("closing the vocoder sequence failed: %s", exc)
        except Exception:
            log.exception("closing the vocoder sequence failed")
        return None

    @staticmethod
    def _wait_end(end: Optional[Pending]) -> None:
        if end is None:
            return
        try:
            end.result(timeout=END_WAIT_S)
        except ChildError as exc:
            log.warning("closing the vocoder sequence failed: %s", exc)
        except Exception:
            log.exception("closing the vocoder sequence failed")

    def _close_vocoder(self) -> None:
        """On every way out: drop the calls still in flight, end the sequence if still open."""
        self._close_forwarder()
        for pending, _ in self._in_flight:
            pending.cancel()
        self._in_flight.clear()
        self._wait_end(self._end_vocoder())
