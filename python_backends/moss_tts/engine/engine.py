"""Engine: one scheduler thread that turns submitted requests into streamed frame codes.

Each step: schedule (retire aborted, admit waiting) -> launch (the admitted prompts' prefill,
then one batched decode step over every running request) -> post-process the *previous*
step's output (frames, stops, budgets, chunks) -> emit. The device state alone decides what a
step computes, so step N+1 is launched before step N's output is read: the host work of one
step overlaps the device work of the next. Requests join and leave between steps, so batches
change every step (continuous batching). Callers talk to it from any thread through submit /
abort / stats / shutdown; events come back through `on_event`, always called from the engine
thread and never under the engine's lock, so a callback may call submit or abort.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import torch

from ..contract.errors import error_text
from ..model.tts_model import MossTTSLocalModel
from .chunk_deadlines import ChunkDeadlines
from .config import EngineConfig
from .events import EngineEvent, Finished, FinishReason
from .first_audio_gate import FirstAudioGate, FirstAudioHold
from .host_turn import HostTurn
from .launch import Launch
from .request import EngineRequest, RequestState
from .runner import ModelRunner
from .scheduler import Schedule, Scheduler
from .stats import EngineStats, StatsCounters

log = logging.getLogger(__name__)
STREAM_PRIORITY = -1  # CUDA: lower is higher (0 is the default); beyond the device's range it maps to its end
EventCallback = Callable[[EngineEvent], None]


class EngineClosed(RuntimeError):
    """submit() after shutdown()."""


class Engine:
    def __init__(self, model: MossTTSLocalModel, config: EngineConfig, on_event: EventCallback,
                 first_audio_gate: Optional[FirstAudioGate] = None, stream=None) -> None:
        """first_audio_gate: the in-process vocoder's posts (first_audio_hold_rows); stream: the CUDA stream to run on."""
        self.config, self._stream = config, stream
        self._model_cfg = model.cfg
        self._runner = ModelRunner(model, config)
        self._scheduler = Scheduler(config)
        # Guards the scheduler (its slot and prefix bookkeeping too), the counters and the stop flag.
        self._cond = threading.Condition()
        self._hold = (FirstAudioHold(first_audio_gate, config.first_audio_hold_rows, self._runner.device)
                      if first_audio_gate is not None and config.first_audio_hold_rows else None)
        self._counters = StatsCounters(hold=self._hold)
        self.host_turn: HostTurn[EngineEvent] = HostTurn(on_event, config.host_turn_ms / 1e3, config.host_turn_deliver_us / 1e6)
        self._emit = self.host_turn.post  # engine thread only (and _cancel_all when it never started)
        self.thread: Optional[threading.Thread] = None  # the loop's (the adapter sets its OS priority)
        self._is_stopping = False
        self._in_flight: Optional[Launch] = None  # engine thread only
        self._step_started: Optional[float] = None  # monotonic start of the step now running
        self._deadlines = ChunkDeadlines() if config.chunk_deadline_ms else None  # engine thread only

    # ---- caller side (any thread) ----

    def start(self) -> None:
        """Allocate device state (errors surface here), then start the engine thread."""
        with self._cond:
            if self.thread is not None or self._is_stopping:
                raise RuntimeError("Engine.start() may be called once, before shutdown()")
            self._runner.setup()
            self.thread = threading.Thread(target=self._loop, name="moss-tts-engine", daemon=True)
        self.thread.start()

    def submit(self, request: EngineRequest) -> None:
        """Queue a request. Raises ValueError (bad request, duplicate id), QueueFull, EngineClosed."""
        request.check_fits(self._model_cfg, self.config)
        state = RequestState.create(request, self.config)
        with self._cond:
            if self._is_stopping:
                raise EngineClosed("the engine is shut down")
            self._scheduler.add(state)
            self._cond.notify()

    def abort(self, request_id: str) -> bool:
        """Cancel a queued or running request at the next step boundary; it then gets
        Finished(reason="cancelled"). False if the id is unknown, finished or already aborted
        (a request finishing in the current step keeps its natural reason)."""
        with self._cond:
            found = self._scheduler.abort(request_id)
            self._cond.notify()
        return found

    def stats(self) -> EngineStats:
        with self._cond:
            cache = self._scheduler.cache
            return self._counters.snapshot(self._scheduler.num_running, self._scheduler.num_waiting,
                                           cache.num_free_slots, cache.prefix_stats())

    def histograms(self) -> dict:
        """{"batch_size": ..., "step_ms": ...}: each (cumulative bucket counts, sum, count)."""
        with self._cond:
            return {"batch_size": self._counters.batch_sizes.cumulative(), "step_ms": self._counters.step_ms.cumulative()}

    def stalled_seconds(self) -> float:
        """How long the step now running has taken (0 between steps): a step that never ends
        (a hung device call) shows here, and the model's heartbeat stops."""
        started = self._step_started
        return 0.0 if started is None else max(0.0, time.monotonic() - started)

    def shutdown(self, timeout: Optional[float] = None) -> None:
        """Stop the thread; requests still queued or running end with reason "cancelled"."""
        with self._cond:
            self._is_stopping = True
            self._cond.notify()
            thread = self.thread
        if thread is threading.current_thread():
            return  # called from on_event: the loop ends after this step
        if thread is not None:
            thread.join(timeout)
        else:
            self._cancel_all("engine shut down")  # never started: nobody else will

    # ---- engine thread ----

    def _loop(self) -> None:
        # No inference_mode here: the runner enters it; chunks built out here are plain tensors.
        if self._runner.device.type == "cuda":
            # The current CUDA device is per thread (a new one starts on cuda:0); replays and kernels use it.
            torch.cuda.set_device(self._runner.device)
            # Its own stream above the default priority (an in-process vocoder's, normal, fills the SMs the
            # steps leave idle, never delaying one), unless it shares one with the vocoder (vocoder_stream).
            torch.cuda.set_stream(self._stream or torch.cuda.Stream(self._runner.device, priority=STREAM_PRIORITY))
        while self._wait_for_work():
            self.host_turn.take()
            self._step_started = time.monotonic()
            try:
                self._step()
            except Exception as exc:  # a bug outside the runner: fail what runs, keep serving
                log.exception("engine step failed")
                self._in_flight = None
                with self._cond:
                    running = list(self._scheduler.running)
                self._fail(running, f"engine step failed: {error_text(exc, with_type=True)}")
            finally:
                self._step_started = None
        self._in_flight = None  # its requests are cancelled below; nobody reads its rows
        self._cancel_all("engine shut down")

    def _wait_for_work(self) -> bool:
        def is_due() -> bool:
            return self._is_stopping or self._scheduler.has_work or self._in_flight is not None
        with self._cond:
            if is_due():
                return not self._is_stopping
        self.host_turn.give()  # going idle: deliver what the engine holds (never under its lock)
        with self._cond:
            self._cond.wait_for(is_due)
            return not self._is_stopping

    def _step(self) -> None:
        start = time.perf_counter()
        plan = self._schedule()
        for state in plan.cancelled:
            self._emit(Finished(state.request_id, "cancelled", None, state.num_flushed))
        staged = [state for state in plan.admitted if self._stage(state)]
        waited = applied = 0.0
        previous, hold = self._in_flight, self._hold
        if hold is not None and hold.applies(len(plan.running)) and previous is not None and previous.ends_first_chunk:
            # Light load: the step ending a first chunk completes, its vocoder round runs, then the next step.
            mark = hold.gate.mark()
            (waited, applied), self._in_flight = self._complete(previous), None
            with self.host_turn.given():
                hold.wait(mark)
        launched = -time.perf_counter()
        launch = self._launch(staged, plan.running)
        launched += time.perf_counter()
        previous, self._in_flight = self._in_flight, launch
        if previous is not None:
            wait, apply = self._complete(previous)
            waited, applied = waited + wait, applied + apply
        with self._cond:
            self._counters.record_time(time.perf_counter() - start - waited, waited, launched, applied)

    def _schedule(self) -> Schedule:
        with self._cond:
            plan = self._scheduler.schedule()  # the admitted hold their slots and prefix matches
            # The aborted slots were given back (and maybe handed out again): mark them idle on
            # the device before any admitted prompt's prefill is staged.
            for state in plan.cancelled:
                self._release(state, "cancelled")
            self._counters.requests_admitted += len(plan.admitted)
        return plan

    def _stage(self, state: RequestState) -> bool:
        try:
            request = state.request
            self._runner.stage_prompt(state.slot, request.prompt_rows, request.params, state.prefix, state.param_rows)
        except Exception as exc:
            log.exception("prefill failed for request %s", state.request_id)
            self._fail([state], f"prefill failed: {error_text(exc, with_type=True)}")
            return False
        state.num_issued = 1  # the prefill samples frame 0
        return True

    def _launch(self, staged: list[RequestState], running: list[RequestState]) -> Optional[Launch]:
        """Launch the staged prefills + one frame for every request that may still generate."""
        decoding = [s for s in running if s.is_running and s.can_issue]
        if not staged and not decoding:
            return None
        with self._cond:
            plan = self._scheduler.cache.plan_step([(s.slot, s.prefix) for s in staged],
                                                   [s.slot for s in decoding])
        try:
            out = self._runner.run_step(plan)
        except Exception as exc:
            log.exception("decode step failed for %d requests", len(decoding))
            with self._cond:
                self._scheduler.cache.abandon(plan)
            self._fail(list(dict.fromkeys(staged + decoding)), f"decode step failed: {error_text(exc, with_type=True)}")
            return None
        for state in decoding:
            state.num_issued += 1
        ends_first_chunk = self._hold is not None and self._hold.ends_first_chunk((*staged, *decoding))
        with self._cond:
            self._counters.record_step(len(set(staged) | set(decoding)), out.graph_use)
        by_slot = {s.slot: s for s in staged}  # the runner orders prefill rows its own way (longest first)
        return Launch(out, [by_slot[slot] for slot in out.prefill_slots], [(s, s.slot) for s in decoding],
                      ends_first_chunk)

    def _complete(self, launch: Launch) -> tuple[float, float]:
        """Apply a finished step's frames: stop, frame budget, chunk emission. Returns the
        seconds spent waiting for the device and the seconds applying the frames."""
        start = time.perf_counter()
        try:
            with self.host_turn.given():  # the stream threads run while the device works
                rows = launch.out.wait()
        except Exception as exc:
            log.exception("step failed on the device")
            self._fail(launch.states, f"decode step failed: {error_text(exc, with_type=True)}")
            return time.perf_counter() - start, 0.0
        waited = time.perf_counter() - start
        # Two conversions to Python lists for the whole step, then per request only a list index. Not numpy
        # rows: numpy gives the GIL up per row copied (half the engine thread's time in an H200 soak, issue 34).
        emitted, codes = rows[:, 0].tolist(), rows[:, 1:].tolist()
        frames = sum(self._apply(state, emitted[i], codes[i]) for i, state in enumerate(launch.prefilled))
        offset = launch.out.decode_offset
        frames += sum(self._apply(state, emitted[offset + slot], codes[offset + slot])
                      for state, slot in launch.decoded)
        if self._deadlines is not None:  # chunks that one more step would send too late leave now
            self._deadlines.flush(launch.states, self._emit)
        with self._cond:
            self._counters.record_frames(frames)
        return waited, time.perf_counter() - start - waited

    def _apply(self, state: RequestState, emitted: int, codes: list[int]) -> int:
        """One frame of a request (emitted flag, its n_vq codes); returns 1 if a frame was added."""
        if not state.is_running:  # ended while the step ran (stop, cancel, error)
            return 0
        if not emitted:
            self._end(state, "stop")
            return 0
        if state.add_frame(codes):  # a chunk is due
            if state.is_at_frame_budget:
                self._end(state, "max_frames")
            else:
                self._emit(state.take_chunk())
        return 1

    def _end(self, state: RequestState, reason: FinishReason, error: Optional[str] = None) -> None:
        """The one way out for a request: remainder chunk, free the slot, then Finished."""
        # A cancelled client no longer wants audio; any other ending delivers what was made.
        chunk = None if reason == "cancelled" else state.take_chunk()
        if chunk is not None:
            self._emit(chunk)
        with self._cond:
            self._release(state, reason)
        self._emit(Finished(state.request_id, reason, error, state.num_flushed))

    def _release(self, state: RequestState, reason: FinishReason) -> None:
        """Forget a request, free its slot and mark it idle on the device; the caller holds the
        lock and emits Finished."""
        self._scheduler.retire(state)
        if state.slot is not None:
            self._runner.release_slot(state.slot)
        state.finish()
        self._counters.record_finish(reason)

    def _fail(self, states: list[RequestState], error: str) -> None:
        for state in states:
            if not state.is_finished:
                self._end(state, "error", error)

    def _cancel_all(self, error: str) -> None:
        with self._cond:
            states = self._scheduler.live()
        for state in states:
            self._end(state, "cancelled", error)
        self.host_turn.give()
