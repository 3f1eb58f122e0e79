"""VocoderWorker: the pipeline's streaming codec decode, inside the `moss_tts` process.

One thread owns a `VocoderSessions` (the batched decoder state, its CUDA graphs) and decodes, in
rounds, the chunks that the stream threads submit. A submit returns a `VocodeJob` at once, so a
stream puts chunk k+1 in while chunk k is still being decoded or sent: each stream can have any
number of chunks in flight, and the worker batches across streams at whatever row count is
waiting. Why in process and not over BLS to the `vocoder` model: a BLS round trip costs two
shared-memory copies, a sequence-batcher queue and Python on both sides per chunk, and two
processes on one GPU only time-slice; here a chunk crosses no process, and the decode runs on a
CUDA stream of its own that overlaps the engine's (docs/scaling.md has the numbers).

A round's work is picked by `jobs.pick_round` (the most urgent sequences, a piece of each) and
held back while it is small and not due (`jobs.hold_until`). Jobs of one sequence complete in
submission order. START takes a zeroed row and END frees it, both on this thread (the state is
only touched here, in stream order). A cancelled job is dropped unread. A decode failure fails
every job of its round (their sequences are ended by VocoderSessions) and the rest of those
sequences' jobs. Codes and audio stay numpy here: every torch call gives the GIL up and must win
it back, so a round makes a fixed few torch calls per step, none per sequence. No Triton import.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from typing import Callable, Hashable, Optional

import numpy as np
import torch

from ..contract.errors import SHUTTING_DOWN, ChildError, ErrorKind, error_text
from ..contract.metrics import BATCH_SIZE_BUCKETS, Histogram
from .config import NoFreeSlot
from .jobs import LoadHold, Round, VocodeJob, hold_until, pick_round, starts_a_sequence
from .sessions import VocoderSessions
from .stats import WorkerStats

log = logging.getLogger(__name__)


class VocoderWorker:
    def __init__(self, sessions: VocoderSessions, idle_seconds: float = 60.0, stream_priority: int = 0,
                 round_rows: int = 0, min_round_frames: int = 0, hold_slack_s: float = 0.25,
                 load_hold: LoadHold = LoadHold(), stream: Optional["torch.cuda.Stream"] = None) -> None:
        """idle_seconds: a sequence without a job this long is ended (its stream died without an END).
        stream_priority: its CUDA stream's (0 = normal; the engine runs above it), unless `stream` is the
        engine's (rounds between steps). min_round_frames, hold_slack_s, load_hold: jobs.hold_until."""
        self.sessions, self.idle_seconds = sessions, idle_seconds
        self.min_round_frames, self.hold_slack_s, self.load_hold = min_round_frames, hold_slack_s, load_hold
        # While a round is held back: until when, the load hold's floor, the frames queued. A submit wakes
        # the worker only if that can change the case (a due chunk cannot move a hold below its floor).
        self._hold, self._hold_floor, self._held_frames = None, 0.0, 0
        self.piece_frames = sessions.config.max_graph_frames
        self.round_rows = round_rows or sessions.step_rows  # sequences decoded per round, at most
        self._queues: "OrderedDict[Hashable, deque[VocodeJob]]" = OrderedDict()
        self._cond = threading.Condition()
        self._is_stopping = False
        self._round_started: Optional[float] = None
        self._rounds = self._jobs = self._frames = self._round_s = 0
        # Worker thread only: why each sequence that failed did, until its END (or a new START), so
        # its later chunks fail the same way, not as "no codec state".
        self._failed: dict[Hashable, ChildError] = {}
        # Streams decoded per round (its count is the rounds): published by the adapter's gauge thread.
        self.round_rows_histogram = Histogram(BATCH_SIZE_BUCKETS)
        device = sessions.config.torch_device  # the stream is made here: the engine may be capturing graphs by then
        self._stream = stream or (torch.cuda.Stream(device, priority=stream_priority) if device.type == "cuda" else None)
        # The engine's FirstAudioGate: while it is `wanted`, each round that starts a sequence is posted.
        self.first_audio_gate = None
        self.thread = threading.Thread(target=self._loop, name="moss-vocoder-worker", daemon=True)  # thread_priority.py
        self.thread.start()

    # ---------------------------------------------------------------- stream threads
    def submit(self, seq: Hashable, codes: np.ndarray, start: bool, end: bool,
               on_done: Callable[[], None] = lambda: None, deadline: Optional[float] = None) -> VocodeJob:
        """Queue the next chunk of `seq` (START opens it, END frees it after this chunk), due by
        `deadline` (time.monotonic(); None = now). Bad codes are refused here (ChildError
        INVALID_ARGUMENT), before they can fail a round."""
        try:
            codes = self.sessions.check(seq, np.asarray(codes))  # numpy only: no GIL hand-off
        except (TypeError, ValueError) as exc:  # np.asarray raises either for what is no array
            raise ChildError(f"vocoder codes refused: {error_text(exc)}", ErrorKind.INVALID_ARGUMENT) from None
        with self._cond:  # the job made under the lock: its waiting_since is never older than a hold taken
            job = VocodeJob(seq, codes.astype(np.int64, copy=False), start, end, on_done,
                            time.monotonic() if deadline is None else deadline, hurry=self._hurry)
            if self._is_stopping:
                raise ChildError(SHUTTING_DOWN, ErrorKind.UNAVAILABLE)
            self._queues.setdefault(seq, deque()).append(job)
            self._held_frames += job.codes.shape[0]
            if (self._hold is None or end or job.deadline - self.hold_slack_s <= self._hold > self._hold_floor
                    or self._held_frames >= self.min_round_frames):
                self._cond.notify()
        return job

    def _hurry(self, job: VocodeJob) -> None:  # VocodeJob.hurry, from a stream's thread
        with self._cond:
            job.deadline = min(job.deadline, time.monotonic())
            if self._hold is None or self._hold > self._hold_floor:  # held to its floor: it waits anyway
                self._cond.notify()

    def stats(self) -> WorkerStats:
        s = self.sessions.stats()
        with self._cond:
            queued = sum(len(q) for q in self._queues.values())
            return WorkerStats(self._rounds, self._jobs, self._frames, int(self._round_s * 1e3), queued,
                               s.active_slots, s.free_slots, s.sessions_started, s.sessions_ended,
                               s.sessions_failed, s.graph_calls, s.decode_calls)

    def stalled_seconds(self) -> float:
        return 0.0 if (started := self._round_started) is None else max(0.0, time.monotonic() - started)

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the round in progress, fail every queued job (UNAVAILABLE), end the thread."""
        with self._cond:
            self._is_stopping = True
            self._cond.notify_all()
        self.thread.join(timeout)
        with self._cond:
            queued = [job for q in self._queues.values() for job in q]
            self._queues.clear()
        for job in queued:
            job._finish(None, ChildError(SHUTTING_DOWN, ErrorKind.UNAVAILABLE))

    # ---------------------------------------------------------------- worker thread
    def _loop(self) -> None:
        if self._stream is not None:
            # Per thread: this thread's device, and a stream of its own so the decode overlaps
            # the engine's steps (which run above it when they have a higher priority).
            torch.cuda.set_device(self._stream.device)
            torch.cuda.set_stream(self._stream)
        # Two rounds overlap: round k+1 is launched before round k's audio is read back and
        # handed to its streams, so the GPU decodes while this thread does a round's host work
        # (splitting audio, completing jobs, waking streams), as the engine overlaps its steps.
        in_flight: Optional[Round] = None
        with torch.inference_mode():
            while True:
                with self._cond:
                    if in_flight is None:
                        self._cond.wait_for(lambda: self._is_stopping or self._queues, timeout=1.0)
                    if self._is_stopping and in_flight is None:
                        return
                    # This round's work, under the lock (jobs.pick_round).
                    picks = [] if self._is_stopping else pick_round(self._queues, self.piece_frames,
                                                                    self.round_rows, self._end_dropped)
                    floor = self.load_hold.floor(picks, len(self.sessions))
                    held = hold_until(picks, self._queues, time.monotonic(), self.min_round_frames,
                                      self.hold_slack_s, floor)
                    if held is not None and in_flight is None:  # until due, or a submit changes the case
                        self._hold, self._hold_floor = held, floor
                        self._held_frames = sum(take for spans in picks for _, take in spans)
                        self._cond.wait(min(1.0, max(0.0, held - time.monotonic())))  # expiry runs below
                        self._hold = None
                    if held is not None:
                        picks = []  # nothing launched now (a round in flight lands first)
                launched = self._timed(self._launch, picks) if picks else None
                if in_flight is not None:
                    self._timed(self._land, in_flight)
                elif held is None and launched is None and not picks:
                    # Nothing to launch or land although jobs are queued: cannot happen by design,
                    # and must never become a loop that spins holding the GIL.
                    with self._cond:
                        self._cond.wait(0.01)
                in_flight = launched
                self.sessions.expire(self.idle_seconds)

    def _timed(self, step: Callable, work) -> Optional["Round"]:
        """Run one half of a round (_launch of picks, or _land of a Round), its wall time counted
        as round time; a defect fails the jobs it holds, not the worker."""
        started = self._round_started = time.monotonic()
        try:
            return step(work)
        except Exception as exc:  # a defect here: fail the round, keep serving
            log.exception("vocoder round failed")
            heads = [spans[0][0] for spans in work] if isinstance(work, list) else work.heads
            self._fail(heads, ChildError(f"vocoder round failed: {error_text(exc, True)}", ErrorKind.INTERNAL))
            return None
        finally:
            self._round_started = None
            with self._cond:
                self._round_s += time.monotonic() - started

    def _end_dropped(self, seq: Hashable) -> None:
        """A cancelled END was dropped from its queue: it will not come again."""
        self._failed.pop(seq, None)
        if seq in self.sessions:
            self.sessions.end(seq)

    def _launch(self, picks: list[list[tuple[VocodeJob, int]]]) -> Optional["Round"]:
        """Start the round's sequences, answer its START/END-only jobs, and enqueue one decode
        of every other sequence's frames without waiting for it: the Round to _land later."""
        with self._cond:
            self._rounds += 1
        heads = [spans[0][0] for spans in picks]
        refused = self._start([job for job in heads if job.start and job.launched == 0])
        pieces: dict[Hashable, np.ndarray] = {}
        plan: dict[Hashable, list[tuple[VocodeJob, int]]] = {}
        for spans in picks:
            head = spans[0][0]
            if head in refused:
                continue
            if not head.codes.shape[0]:
                self._complete(head)  # START or END alone: no GPU work, no reason to wait for the step
                continue
            if not (head.start and head.launched == 0) and head.seq not in self.sessions:
                # Checked per job: VocoderSessions would refuse the whole call, every stream of it.
                self._fail([head], self._failed.get(head.seq) or ChildError(
                    f"vocoder sequence {head.seq!r} has no codec state (never started, ended, or idle-expired)",
                    ErrorKind.INTERNAL))
                continue
            codes = [job.codes[job.launched:job.launched + take] for job, take in spans]
            pieces[head.seq] = codes[0] if len(codes) == 1 else np.concatenate(codes)
            plan[head.seq] = spans
        if not pieces:
            return None
        self.round_rows_histogram.observe(len(pieces))
        try:
            pending = self.sessions.decode_async(pieces, checked=True)  # checked at submit
        except Exception as exc:  # VocoderSessions ended every sequence of the call
            kind = ErrorKind.UNAVAILABLE if isinstance(exc, torch.cuda.OutOfMemoryError) else ErrorKind.INTERNAL
            log.exception("vocoder decode failed for %d sequences", len(pieces))
            self._fail([spans[0][0] for spans in plan.values()],
                       ChildError(f"vocoder decode failed: {error_text(exc)}; the stream was ended", kind))
            return None
        now = time.monotonic()
        for job, take in (span for spans in plan.values() for span in spans):  # frames handed to the GPU
            job.launched, job.launched_at = job.launched + take, job.launched_at or now
            job.waiting_since = now  # what is left of it waits anew (LoadHold)
        if (gate := self.first_audio_gate) is not None and gate.wanted and starts_a_sequence(plan):
            gate.round_launched(None if self._stream is None else self._stream.record_event())  # None on CPU
        return Round(plan, pending)

    def _land(self, round_: "Round") -> None:
        """Wait for a launched round's audio and hand each job its part; complete the jobs
        whose every frame is back, in order (each is then its sequence's head)."""
        try:
            audio = round_.pending.wait()
        except Exception as exc:  # an error of the device: these sequences' state is lost
            log.exception("vocoder decode failed for %d sequences", len(round_.plan))
            for job in round_.heads:
                job.position = job.launched  # no longer in flight: _fail may drop it
            self._fail(round_.heads, ChildError(f"vocoder decode failed: {error_text(exc)}; the stream was ended",
                                                ErrorKind.INTERNAL))
            return
        for seq, spans in round_.plan.items():
            samples = audio[seq]  # a view of its step's host buffer, which no later round writes
            per_frame = samples.shape[-1] // sum(take for _, take in spans)
            offset = 0
            for job, take in spans:
                job.parts.append(samples[:, offset:offset + take * per_frame])
                offset += take * per_frame
                job.position += take
            self._frames += offset // per_frame
            for job, _ in spans:
                if job.position == job.codes.shape[0] and not job.done() and not job.is_cancelled:
                    self._complete(job)

    def _start(self, jobs: list[VocodeJob]) -> list[VocodeJob]:
        """Open the sequences of the round's START jobs, each on a zeroed row (VocoderSessions.start_many);
        returns the jobs refused (failed with UNAVAILABLE: every slot is taken)."""
        for job in jobs:
            self._failed.pop(job.seq, None)
            if job.seq in self.sessions:
                self.sessions.end(job.seq)  # a restarted id starts from fresh state
        results = self.sessions.start_many([job.seq for job in jobs])
        refused = [job for job in jobs if isinstance(results[job.seq], NoFreeSlot)]
        for job in refused:
            self._fail([job], ChildError(str(results[job.seq]), ErrorKind.UNAVAILABLE))
        return refused

    def _complete(self, job: VocodeJob) -> None:
        """Answer `job`, and at once any END-only calls queued right behind it (no GPU work: the
        stream's final response waits on its END)."""
        while job is not None:
            if job.end:
                self._failed.pop(job.seq, None)
                if job.seq in self.sessions:
                    self.sessions.end(job.seq)
            with self._cond:
                queue = self._queues.get(job.seq)
                if queue and queue[0] is job:
                    queue.popleft()
                follower = queue[0] if queue else None
                self._jobs += 1
            job._finish(job.parts, None)  # result() joins the pieces on the stream's thread
            is_end_only = follower is not None and not follower.start and not follower.codes.shape[0]
            job = follower if is_end_only and not follower.is_cancelled else None

    def _fail(self, jobs: list[VocodeJob], error: ChildError) -> None:
        """Fail `jobs` and every later job of their sequences (their state is gone or never was),
        queued ENDs included: the sequences are cancelled here, so their slots are free already."""
        for seq in {job.seq for job in jobs}:
            with self._cond:
                queue = self._queues.pop(seq, deque())
            if seq in self.sessions:
                self.sessions.cancel(seq)
            failed = [*(j for j in jobs if j.seq == seq and j not in queue), *queue]
            if not any(job.end for job in failed):  # its END (or next START) is still to come
                self._failed[seq] = error
            for job in failed:
                job._finish(None, error)
