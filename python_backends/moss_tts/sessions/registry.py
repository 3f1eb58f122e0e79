"""SessionRegistry: text sessions, the requests of one SESSION_ID spoken as one stream.

A client streams text in segments, one request per segment, each naming the session. The session
keeps between its requests what makes them one utterance: the voice (the first request's
reference, or the first segment's first VOICE_FRAMES code frames) and one vocoder sequence
(opened by the first segment's first chunk, continued by every later one, so the audio joins
without a click). Requests run in arrival order, one at a time: each waits for its turn (the
previous request's final response sent), so the audio on the stream follows the text. Requests
that carry SESSION_INDEX run in index order instead, whatever order they arrive in (a session's
requests relayed from another instance arrive late, relay.py); a session is indexed or
not from its first request on.

A session ends by SESSION_END, and is freed at once on a cancel or failure of any of its
requests, and after `session_idle_timeout_s` without a request (`expire`, called by a reaper
thread); each frees the voice and ends the vocoder sequence (`end_vocoder(sequence_id)`).
A later request naming a closed session is told why (a bounded memory of closed ids). With
several instances of the model, `SessionClaims` refuses a request that reached an instance other
than the one holding its session. No Triton import; the clock is injected for tests.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..contract.errors import ErrorKind, InvalidRequest, ServingError
from ..contract.parameters import config_fields
from ..pipeline.playback import Playback
from ..pipeline.segmented_codes import VoiceFrames
from .claims import SessionClaims

CLOSED_IDS_KEPT = 4096  # closed sessions remembered, to tell a late request why its session is gone
# Indexed sessions: a relayed request reaches the holder within milliseconds, so an index missing
# this long while later ones wait was refused before it got here (or never sent). Its turn is
# skipped; a missing index 0 (the voice) fails the session.
GAP_S = 2.0
REASONS = ("ended", "expired", "cancelled", "failed")


@dataclass(frozen=True)
class SessionConfig:
    """The `moss_tts` pbtxt parameters of these names."""
    max_sessions: int = 256  # open at once; one more is refused (UNAVAILABLE)
    session_idle_timeout_s: float = 30.0  # without a request this long, a session is freed

    def __post_init__(self):
        if self.max_sessions < 1 or not 0 < self.session_idle_timeout_s <= 3600:
            raise ValueError(f"max_sessions must be >= 1 and session_idle_timeout_s in (0, 3600]; got "
                             f"{self.max_sessions}, {self.session_idle_timeout_s}")

    @classmethod
    def from_parameters(cls, parameters) -> "SessionConfig":
        return cls(**config_fields(cls, parameters))

    def vocoder_idle_problem(self, vocoder_idle_s: Optional[float]) -> Optional[str]:
        """Why sessions cannot serve beside an in-process vocoder that ends a sequence idle for
        `vocoder_idle_s` (None: no such vocoder here), or None: it would end a session's under it."""
        if vocoder_idle_s is None or self.session_idle_timeout_s < vocoder_idle_s:
            return None
        return (f"session_idle_timeout_s ({self.session_idle_timeout_s:g}) must be below vocoder_idle_s "
                f"({vocoder_idle_s:g}): the vocoder would end an idle session's sequence under it")


class TextSession:
    """One session's state: its voice, its vocoder sequence, and whose turn it is."""

    def __init__(self, session_id: str, sequence_id: int, now: float) -> None:
        self.session_id = session_id
        self.sequence_id = sequence_id  # the vocoder sequence of the whole session
        self.reference: Optional[np.ndarray] = None  # the first request's reference codes, if it had one
        self.voice = VoiceFrames()  # else the first segment's frames
        self.playback = Playback()  # its listener's clock, shared by its requests (pipeline/playback.py)
        self.is_vocoder_open = False  # START sent, END not yet
        self.last_active = now
        self.closed: Optional[str] = None  # a REASONS value once closed
        self._next_ticket = 0
        self._turn = 0
        self._num_holding = 0  # requests entered and not finished
        self.indexed: Optional[bool] = None  # its requests carry SESSION_INDEX (set by the first)
        self._indices: set[int] = set()  # indexed: the indices entered and not yet finished
        self._missing: Optional[tuple[int, float]] = None  # (turn, since when) its request has not come
        self._cond = threading.Condition()

    def voice_codes(self) -> Optional[np.ndarray]:
        """The reference of a later segment: the session's reference, else its first frames."""
        return self.reference if self.reference is not None else self.voice.codes()

    @property
    def is_busy(self) -> bool:
        return self._num_holding > 0

    @property
    def is_missing_its_turn(self) -> bool:
        """Indexed, with requests waiting, and the one whose turn it is has not come."""
        return bool(self.indexed) and self._num_holding > 0 and self._turn not in self._indices

    def has_gap(self, now: float) -> bool:
        """Its turn's request has been missing for GAP_S (seen by the reaper, which calls this)."""
        if not self.is_missing_its_turn:
            self._missing = None
            return False
        if self._missing is None or self._missing[0] != self._turn:
            self._missing = (self._turn, now)
            return False
        return now - self._missing[1] >= GAP_S

    def _take_ticket(self, index: Optional[int] = None) -> int:
        with self._cond:
            if self.indexed is None:
                self.indexed = index is not None
            if self.indexed != (index is not None):
                raise InvalidRequest(f"text session {self.session_id!r}: SESSION_INDEX on "
                                     f"{'every' if self.indexed else 'no'} request of a session, as on its first")
            if index is None:
                ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            else:
                if index < self._turn or index in self._indices:
                    raise InvalidRequest(f"text session {self.session_id!r}: SESSION_INDEX {index} was already sent, "
                                         f"or came more than {GAP_S:g} s after later ones and its turn was skipped")
                self._indices.add(index)
                ticket = index
            self._num_holding += 1
            return ticket

    def wait_turn(self, ticket: int, should_stop: Callable[[], bool], wait_s: float = 1.0) -> bool:
        """Block until the requests before `ticket` are done: True, or False if the session closed
        (or `should_stop()`, checked every `wait_s`) first."""
        with self._cond:
            while self._turn != ticket and self.closed is None:
                if not self._cond.wait(wait_s) and should_stop():
                    return False
            return self.closed is None

    def _skip_turn(self) -> None:
        with self._cond:
            self._turn += 1
            self._missing = None
            self._cond.notify_all()

    def _finish_turn(self, now: float) -> None:
        with self._cond:
            self._indices.discard(self._turn)
            self._turn += 1
            self._num_holding -= 1
            self.last_active = now
            self._cond.notify_all()

    def _close(self, reason: str) -> None:
        with self._cond:
            self.closed = reason
            self._cond.notify_all()


@dataclass(frozen=True)
class SessionStats:
    open: int
    waiting: int  # requests of open sessions not yet finished (running or waiting their turn)
    opened: int
    ended: int
    expired: int
    cancelled: int
    failed: int
    refused: int  # new sessions refused at max_sessions
    relayed: int  # requests sent on to the instance holding their session (several instances)


class SessionRegistry:
    def __init__(self, config: SessionConfig, end_vocoder: Callable[[int], None],
                 new_sequence_id: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 claims: Optional[SessionClaims] = None) -> None:
        """claims: where this server's instances record which one holds each session (several
        instances of the model); None = this instance is the only one."""
        self.config = config
        self.claims = claims
        self.end_vocoder = end_vocoder  # ends a session's vocoder sequence (best effort, must not raise)
        self.new_sequence_id = new_sequence_id
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, TextSession] = {}
        self._closed: "OrderedDict[str, str]" = OrderedDict()  # id -> reason, most recent last
        self._counts = dict.fromkeys((*REASONS, "opened", "refused", "relayed"), 0)
        self._reaper: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def is_open(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._open

    def join(self, session_id: str, is_end: bool, has_text: bool,
             index: Optional[int] = None) -> tuple[TextSession, int, bool]:
        """The session a request belongs to, its ticket (its turn: `index` if given), and whether it
        opens the session. Raises InvalidRequest for a closed or unknown session it cannot open, or
        an index out of place; ServingError UNAVAILABLE beyond max_sessions."""
        with self._lock:
            session = self._open.get(session_id)
            if session is None:
                self._check_new(session_id, is_end, has_text, index)
                if self.claims is not None:
                    self.claims.claim(session_id)  # SessionHeldElsewhere if another instance holds it
                session = self._open[session_id] = TextSession(session_id, self.new_sequence_id(), self.clock())
                self._counts["opened"] += 1
                is_new = True
            else:
                is_new = False
            session.last_active = self.clock()
            # A new session takes any index; only a later request's can be out of place.
            return session, session._take_ticket(index), is_new

    def _check_new(self, session_id: str, is_end: bool, has_text: bool, index: Optional[int]) -> None:
        reason = self._closed.get(session_id)
        if reason is not None:
            why = {"ended": "it was ended (SESSION_END)",
                   "expired": f"it was idle for more than {self.config.session_idle_timeout_s:g} s "
                              f"(session_idle_timeout_s)",
                   "cancelled": "a request of it was cancelled", "failed": "a request of it failed"}[reason]
            raise InvalidRequest(f"session {session_id!r} is closed: {why}; start a new session with a new SESSION_ID")
        if is_end and not has_text and not index:  # an indexed one may overtake the session's others
            raise InvalidRequest(f"SESSION_END for unknown session {session_id!r}: no open session has this "
                                 f"SESSION_ID (send its text first, or drop SESSION_END)")
        if len(self._open) >= self.config.max_sessions:
            self._counts["refused"] += 1
            raise ServingError(f"server busy: {self.config.max_sessions} text sessions open (max_sessions); "
                               f"retry later", ErrorKind.UNAVAILABLE)

    def count_relayed(self) -> None:
        with self._lock:
            self._counts["relayed"] += 1

    def finish(self, session: TextSession, outcome: Optional[str] = None) -> None:
        """A request of `session` is done; `outcome` (a REASONS value) closes the session."""
        if outcome is not None:  # before the turn passes: the next request must find it closed
            self.close(session, outcome)
        session._finish_turn(self.clock())

    def close(self, session: TextSession, reason: str) -> None:
        """Free the session (idempotent): no more requests, its vocoder sequence ended."""
        with self._lock:
            if self._open.get(session.session_id) is not session:
                return
            del self._open[session.session_id]
            if self.claims is not None:
                self.claims.release(session.session_id)
            self._closed[session.session_id] = reason
            while len(self._closed) > CLOSED_IDS_KEPT:
                self._closed.popitem(last=False)
            self._counts[reason] += 1
        session._close(reason)
        if session.is_vocoder_open:
            session.is_vocoder_open = False
            self.end_vocoder(session.sequence_id)
        session.reference, session.voice = None, VoiceFrames()

    def expire(self) -> int:
        """Close the sessions idle for longer than the timeout (no request running or waiting), and
        settle indexed sessions whose next index has been missing for GAP_S."""
        now = self.clock()
        with self._lock:
            idle = [s for s in self._open.values()
                    if not s.is_busy and now - s.last_active > self.config.session_idle_timeout_s]
            gaps = [s for s in self._open.values() if s.has_gap(now)]
        for session in idle:
            self.close(session, "expired")
        for session in gaps:
            if session._turn == 0:  # no voice without the first request
                self.close(session, "failed")
            else:
                session._skip_turn()
        return len(idle)

    def stats(self) -> SessionStats:
        with self._lock:
            waiting = sum(s._num_holding for s in self._open.values())
            return SessionStats(len(self._open), waiting, **{k: self._counts[k] for k in
                                                             ("opened", *REASONS, "refused", "relayed")})

    def start_reaper(self, interval_s: float = 0.5) -> None:
        def reap():
            while not self._stop.wait(interval_s):
                self.expire()
        self._reaper = threading.Thread(target=reap, name="moss-tts-session-reaper", daemon=True)
        self._reaper.start()

    def stop(self) -> None:
        """Stop the reaper and close every open session."""
        self._stop.set()
        with self._lock:
            sessions = list(self._open.values())
        for session in sessions:
            self.close(session, "failed")
        if self.claims is not None:
            self.claims.release_all()

