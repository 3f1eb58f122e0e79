"""Scheduler: who waits, who runs, who is admitted at the next step boundary, and (through its
CacheManager) which KV slot and prefix blocks each request uses. Policy only, no tensors; not
thread-safe by itself (the engine calls it under its lock)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .cache_manager import CacheManager
from .config import EngineConfig
from .request import RequestState


class QueueFull(RuntimeError):
    """max_queue requests are already waiting; the caller should retry later (UNAVAILABLE)."""


@dataclass(frozen=True)
class Schedule:
    """One step's plan. `cancelled` have left the queues; the engine still holds their slots."""

    cancelled: list[RequestState]
    admitted: list[RequestState]  # to prefill this step, slot assigned; already part of `running`
    running: list[RequestState]  # to decode this step, in slot-independent admission order


class Scheduler:
    def __init__(self, config: EngineConfig) -> None:
        self.max_queue = config.max_queue
        self.prefill_budget = config.prefill_chunk_tokens
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self._live: dict[str, RequestState] = {}
        self._num_abort_requested = 0
        self.cache = CacheManager(config.max_running_requests, config.prefix_blocks, config.prefix_block_rows)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, state: RequestState) -> None:
        if state.request_id in self._live:
            raise ValueError(f"request_id {state.request_id!r} is already queued or running")
        if len(self.waiting) >= self.max_queue:
            raise QueueFull(f"{len(self.waiting)} requests are waiting (EngineConfig.max_queue="
                            f"{self.max_queue}); retry later")
        self.waiting.append(state)
        self._live[state.request_id] = state

    def abort(self, request_id: str) -> bool:
        """Mark a live request for cancellation at the next step; False if unknown or marked."""
        state = self._live.get(request_id)
        if state is None or state.is_abort_requested:
            return False
        state.is_abort_requested = True
        self._num_abort_requested += 1
        return True

    def schedule(self) -> Schedule:
        cancelled = self._take_aborted()
        running = list(self.running)
        admitted = self._admit()
        return Schedule(cancelled, admitted, running + admitted)

    def _take_aborted(self) -> list[RequestState]:
        """Aborted requests leave the queues (and their slots) here; the engine marks the slots idle."""
        if not self._num_abort_requested:
            return []
        aborted = [s for s in self.live() if s.is_abort_requested]
        for state in aborted:
            self.retire(state)
        return aborted

    def _admit(self) -> list[RequestState]:
        """FIFO while slots are free and the step's prefill budget lasts (the first always fits).
        The budget counts the rows a prompt's prefill computes: not the prefix it copies from
        the pool (a wave of prompts that share an instruction block or a speaker's reference
        is admitted in one step, not one step per prompt_len's worth)."""
        admitted: list[RequestState] = []
        budget = self.prefill_budget
        while self.waiting and self.cache.num_free_slots:
            rows = self.waiting[0].request.prompt_rows
            cost, hashes = self.cache.prefill_rows(rows, self.waiting[0].block_names)
            if admitted and cost > budget:
                break
            state = self.waiting.popleft()
            budget -= cost
            state.start(*self.cache.allocate(rows, hashes))
            self.running.append(state)
            admitted.append(state)
        return admitted

    def retire(self, state: RequestState) -> None:
        """Forget a request that ended (any reason), wherever it was, and free its slot."""
        if self._live.pop(state.request_id, None) is None:
            return
        if state in self.running:
            self.running.remove(state)
            self.cache.free(state.slot)
        else:
            self.waiting.remove(state)
        if state.is_abort_requested:
            self._num_abort_requested -= 1

    def live(self) -> list[RequestState]:
        return [*self.waiting, *self.running]
