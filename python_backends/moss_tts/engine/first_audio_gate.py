"""FirstAudioGate: at light load, the engine's next step waits for the vocoder round that carries a
new stream's first chunk, so that round runs alone on the GPU.

Why (issue 34, round 8's first-audio trace of one stream on the H200): the first chunk's codec
step takes ~3.9 ms alone but ~7.3 ms beside the engine's next steps. At one stream both are
bound by HBM bandwidth (the engine reads its 8 GB of weights a frame), and a stream priority
orders block dispatch, not bandwidth (round 8 measured that too). So when a step that ends some
stream's first chunk is in flight and the engine runs at most EngineConfig.first_audio_hold_rows
rows, the engine completes that step before launching the next, waits (host side, at most
`timeout_s`) until the vocoder has launched a round that starts a sequence, and makes its own
stream wait for that round's CUDA event: the next step runs after the round, not beside it.
The engine loses one round's time per new stream, which only light load can afford; under load
the gate is never consulted.

The vocoder worker posts every round that starts a sequence (`round_launched`); the engine takes
`mark()` before the chunk is emitted and waits for a post after it (`wait_round`), so a post that
races the emission is never missed. Any round that starts a sequence ends the wait: at light load
that is the first chunk's, and waiting for another one only releases the engine early.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Sequence

import torch

TIMEOUT_S = 0.004  # a first chunk's round is launched ~1 ms after its emission at light load; a
# stream that wants no audio from the vocoder (codes only, STREAM=false) costs at most this once


class FirstAudioGate:
    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        # Set by the engine at each step: it runs few enough rows to hold. Under load nothing
        # waits, so the vocoder records no event (each is a torch call: a GIL hand-off).
        self.wanted = True
        self._cond = threading.Condition()
        self._posted = 0
        self._event: Any = None  # the last posted round's CUDA event (None on CPU)

    # ---- vocoder worker thread
    def round_launched(self, event: Any) -> None:
        """A round that starts a sequence was launched; `event` was recorded behind it on the
        vocoder's stream (None when the vocoder runs on the CPU)."""
        with self._cond:
            self._posted += 1
            self._event = event
            self._cond.notify_all()

    # ---- engine thread
    def mark(self) -> int:
        """The number of rounds posted so far: wait_round(mark) waits for a later one."""
        with self._cond:
            return self._posted

    def wait_round(self, after: int, timeout_s: Optional[float] = None) -> tuple[bool, Any]:
        """(True, its event) once a round is posted after `after`, else (False, None) after the timeout."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._posted > after, self.timeout_s if timeout_s is None else timeout_s):
                return False, None
            return True, self._event


class FirstAudioHold:
    """The engine thread's side of the gate: when a step ends a first chunk at light load, and
    how long the engine then waits. Its counters are the engine's stats (StatsCounters.hold)."""

    def __init__(self, gate: FirstAudioGate, max_rows: int, device: torch.device) -> None:
        self.gate, self.max_rows, self.is_cuda = gate, max_rows, device.type == "cuda"
        self.holds = self.timeouts = 0
        self.seconds = 0.0

    def ends_first_chunk(self, states: Sequence) -> bool:
        """A step of these rows, just launched, ends some state's first chunk (looked at only at
        light load: a pass over every row each step costs the host under load)."""
        return len(states) <= self.max_rows and any(state.ends_first_chunk_when_issued for state in states)

    def applies(self, num_running: int) -> bool:
        applies = 0 < num_running <= self.max_rows
        if self.gate.wanted != applies:
            self.gate.wanted = applies
        return applies

    def wait(self, mark: int) -> None:
        """Wait (host) for a round posted after `mark`, then order the current stream behind its
        event (device): no host sync on the round itself."""
        start = time.perf_counter()
        posted, event = self.gate.wait_round(mark)
        if event is not None and self.is_cuda:
            torch.cuda.current_stream().wait_event(event)
        self.holds, self.timeouts = self.holds + 1, self.timeouts + (not posted)
        self.seconds += time.perf_counter() - start
