"""VocodeJob: one chunk of one sequence in the VocoderWorker, and how a round picks its work from
the sequences' queues of jobs.

A round takes the sequences whose audio is due first (each job carries a deadline: when its
stream's listener would run out of audio without it), at most `round_rows` of them, and decodes
up to `piece_frames` frames of each (the graphs' largest shape), drawn from as many of the
sequence's queued jobs as that takes. So a short round serves the most urgent chunks (a new
stream's first ones) soon, and a stream whose chunks queued up decodes them as one wide row. A
long job (`STREAM=false`, a primed reference) advances one piece per round, so it never holds
the streams' chunks back for more than one step. A round of few frames, none of them due soon,
waits for more (`hold_until`). No Triton import."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Optional

import numpy as np

from ..contract.errors import ChildError, ErrorKind
from .step_buffers import PendingAudio

log = logging.getLogger(__name__)


class VocodeJob:
    """One chunk of one sequence in the worker: `result()` waits for its audio [2, S] float32."""

    def __init__(self, seq: Hashable, codes: np.ndarray, start: bool, end: bool,
                 on_done: Callable[[], None], deadline: float,
                 hurry: Callable[["VocodeJob"], None] = lambda job: None) -> None:
        self.seq, self.codes, self.start, self.end = seq, codes, start, end
        self.deadline = deadline  # time.monotonic() by which its audio is due
        # LoadHold: since when its frames not yet launched have waited for a round (queued, then
        # each piece's launch: a 25-frame chunk goes in pieces of 10, an offline job in many).
        self.waiting_since = time.monotonic()
        self.on_done = on_done  # called once, on the worker thread, when the job completes: keep it cheap
        self.launched = 0  # frames handed to the GPU so far
        self.position = 0  # frames decoded and back on the host so far
        self.parts: list[np.ndarray] = []
        self.is_cancelled = False
        # time.monotonic() when a round first carried its frames, and when it completed (the
        # first-audio trace reads them: waiting for a round, then the round).
        self.launched_at = self.finished_at = 0.0
        # Done: a flag, and a lock held from here until then that a waiter acquires (and hands
        # on) to sleep until it is released. A threading.Event is a Python Condition: 2 µs to make
        # (of a job's 2.7), and its set and wait run Python lock hand-offs, once per chunk on the
        # worker and on the stream (VocodeJob 2.4% of the GIL in the H200 soak, issue 34).
        self._is_done = False
        self._latch = threading.Lock()
        self._latch.acquire()
        self._parts: list[np.ndarray] = []  # the audio's pieces (views of rounds' host buffers) once done
        self._audio: Optional[np.ndarray] = None  # joined from _parts by the first result()
        self._join_lock = threading.Lock()
        self._error: Optional[ChildError] = None
        self._hurry = hurry  # the worker's: makes the job due now and wakes the worker

    def done(self) -> bool:
        return self._is_done

    def wait(self, timeout: Optional[float] = None) -> bool:
        if self._is_done:
            return True
        if self._latch.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._latch.release()  # the next waiter's turn (_finish releases once: a second finish returns early)
            return True
        return self._is_done

    def result(self, timeout: Optional[float] = None) -> np.ndarray:
        if not self.wait(timeout):
            raise ChildError(f"the vocoder did not answer within {timeout} s", ErrorKind.UNAVAILABLE)
        if self._error is not None:
            raise self._error
        # Joined here, on the caller's (a stream's) thread, not on the worker's: numpy gives the
        # GIL up while it copies, and the worker thread would then wait its turn to win it back,
        # once per job of a round (18% of its time under the H200 soak, py-spy, issue 34).
        with self._join_lock:
            if self._audio is None:
                parts = self._parts
                self._audio = (np.zeros((2, 0), np.float32) if not parts else parts[0] if len(parts) == 1
                               else np.concatenate(parts, axis=-1))
                self._parts = []
            return self._audio

    def cancel(self) -> None:
        """The stream no longer wants this audio (cancelled, failed): the worker skips the job."""
        self.is_cancelled = True

    def hurry(self) -> None:
        """Its stream waits for this audio to finish (all its codes are in): due now, so no
        round that carries it is held back (a text session's sentence has no END behind it)."""
        self._hurry(self)

    @property
    def frames_left(self) -> int:
        """Frames not yet handed to the GPU."""
        return self.codes.shape[0] - self.launched

    @property
    def is_in_flight(self) -> bool:
        """Some of its frames are in a round that has not landed yet."""
        return self.launched > self.position

    def _finish(self, parts: Optional[list[np.ndarray]], error: Optional[ChildError]) -> None:
        """Done: with the audio's pieces in order (result() joins them), or with `error`. Once: a
        second finish (stop() beside a worker that outlived its join) changes nothing."""
        with self._join_lock:
            if self._is_done:
                return
            self._parts, self._error = parts or [], error
            self.parts = []
            self.finished_at = time.monotonic()
            self._is_done = True  # before the release: a waiter let through reads the audio
        self._latch.release()
        try:
            self.on_done()
        except Exception:  # a waker must never stop the worker
            log.exception("vocoder job callback failed")


@dataclass
class Round:
    """A launched round: per sequence, the (job, frames) it decodes, and its audio on the way."""

    plan: dict[Hashable, list[tuple[VocodeJob, int]]]
    pending: PendingAudio

    @property
    def heads(self) -> list[VocodeJob]:
        return [spans[0][0] for spans in self.plan.values()]


def take_frames(queue: "deque[VocodeJob]", budget: int) -> list[tuple[VocodeJob, int]]:
    """Up to `budget` frames of one sequence (a round's piece), from its first job with frames not yet
    handed out: a stream whose chunks queued up decodes them as one row (one step, not one
    per chunk). A START behind other jobs waits until they are done (it restarts the row)."""
    spans = []
    for i, job in enumerate(queue):
        if job.is_cancelled or (i and job.start):
            break
        if not job.frames_left:
            if job.codes.shape[0] and not job.end:
                continue  # all its frames are in flight: the next job may follow them
            break  # an END (its frames in flight) or a job without frames: nothing after it
        take = min(budget, job.frames_left)
        spans.append((job, take))
        budget -= take
        if budget == 0 or job.end or take < job.frames_left:
            break
    return spans


def pick_round(queues: "dict[Hashable, deque[VocodeJob]]", piece_frames: int, round_rows: int,
               end_dropped: Callable[[Hashable], None]) -> list[list[tuple[VocodeJob, int]]]:
    """A round's work: per sequence, the jobs and how many of their frames to decode
    ([(job, frames), ...]). Cancelled jobs at a queue's head are dropped first (a dropped END
    calls `end_dropped(seq)`), unless a round still in flight holds their frames (they go once it
    lands). Sequences with frames to hand out are taken by deadline, at most round_rows; a START
    or END alone at its queue's head costs no row and is always taken."""
    picks, urgent = [], []
    for seq in list(queues):
        queue = queues[seq]
        while queue and (queue[0].done() or queue[0].is_cancelled and not queue[0].is_in_flight):
            job = queue.popleft()
            if job.done():  # completed or failed behind a cancelled head that was in flight
                continue
            if job.end:
                end_dropped(job.seq)
            job._finish(None, ChildError("cancelled", ErrorKind.CANCELLED))
        if not queue:
            del queues[seq]
        elif not queue[0].codes.shape[0]:
            picks.append([(queue[0], 0)])
        else:
            spans = take_frames(queue, piece_frames)
            if spans:
                urgent.append(spans)
    urgent.sort(key=lambda spans: spans[0][0].deadline)
    return picks + urgent[:round_rows]


def starts_a_sequence(plan: "dict[Hashable, list[tuple[VocodeJob, int]]]") -> bool:
    """A launched round's plan decodes some START job's first frames (the engine's first-audio
    gate waits for such a round)."""
    return any(spans[0][0].start and spans[0][0].launched == spans[0][1] for spans in plan.values())


def hold_until(picks: list[list[tuple[VocodeJob, int]]], queues: "dict[Hashable, deque[VocodeJob]]",
               now: float, min_frames: int, slack_s: float, floor: float = 0.0) -> Optional[float]:
    """When a round of `picks` is worth launching: None = now, else the time.monotonic() to
    launch it by. Every round pays a fixed cost (~4.5 ms of GPU for the smallest step on the
    H200) and shares the GPU with the engine's steps, so a round of a few frames whose audio is
    not due yet waits for more: until `min_frames` are queued, or until its most urgent chunk
    is due within `slack_s` (the time a round and its send take). Due at once: a START or END
    alone, and a sequence whose END is queued (its stream's final response waits for it; a
    stream that waits for its last calls without an END behind them hurries them instead).
    `floor` (LoadHold.floor, under load): a small round waits until then whatever is due."""
    if min_frames <= 0 or not picks:
        return None
    frames, is_due_now = 0, False
    for spans in picks:
        head = spans[0][0]
        is_due_now = is_due_now or not head.codes.shape[0] or queues[head.seq][-1].end
        frames += sum(take for _, take in spans)
    if frames >= min_frames:
        return None
    due = max(now if is_due_now else min(spans[0][0].deadline for spans in picks) - slack_s, floor)
    return None if due <= now else due


@dataclass(frozen=True)
class LoadHold:
    """Under load (at least `streams` open sequences) a small round waits until the frames of
    its longest-waiting job have waited `seconds` (since queued, or since its last piece went out),
    even when some of it is due now. The 330 s soak starts ~180 streams a second, so a first chunk
    (due at once) is nearly always queued and no round was ever held: every round carried ~118
    frames at ~116 µs a frame of shared GPU (a 1,361-frame round alone: 34), the vocoder busy 94%
    (issue 34, rounds 8-10). Waiting is the trade: first audio for GPU time. Off below `streams`
    (one stream's first audio is untouched) and at 0 seconds.

    Counted from a job's submit, the hold held nothing in rounds 10 and 12: a round decodes at
    most 10 frames of a sequence, so 16- and 25-frame chunks and offline jobs stay queued over
    several rounds, and some job in every round had been queued past the hold already."""
    streams: int = 0
    seconds: float = 0.0

    def floor(self, picks: list[list[tuple[VocodeJob, int]]], num_open: int) -> float:
        if self.seconds <= 0 or num_open < self.streams or not picks:
            return 0.0
        return min(job.waiting_since for spans in picks for job, _ in spans) + self.seconds
