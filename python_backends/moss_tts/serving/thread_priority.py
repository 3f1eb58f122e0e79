"""Real-time OS priority for the `moss_tts` stub's two host-critical threads: the engine's loop and
the in-process vocoder's worker (config `engine_rt_priority`, `vocoder_rt_priority`; 0 = off).

Why: the stub is one Python process whose ~300 threads share one GIL. Under the H200 mixed soak
the GIL was held ~80% of the time (round 11's py-spy record: the stream threads 53% of it, the
engine 21%), and the engine thread spent ~18 ms of host time a step for ~4 ms of its own Python:
it gives the GIL up at every device call and then queues to win it back behind the runnable
stream threads. CPython hands a released GIL to whichever waiter the kernel wakes first, and the
kernel wakes futex waiters in priority order when they run under SCHED_FIFO, so a real-time
engine thread wins the GIL back at the next switch instead of after the queue (on the 2-core dev
machine, the wait to regain it beside 32 busy threads fell from 3.3 ms to 0.24 ms at the p50).
Both threads wait for the device on blocking CUDA events (engine/runner.py, vocoder/sessions.py):
a real-time thread that spun through its device waits would run ~100% of its core, and Linux
throttles a real-time thread past 95% of a second (sched_rt_runtime_us) for the rest of it, a
50 ms stop every second (seen on the dev machine with a spinning SCHED_FIFO thread). Asleep on the
device most of a step, they cannot starve the other threads either. Children of these threads do
not inherit the policy (SCHED_RESET_ON_FORK).

Only on a GPU: on the CPU the engine thread computes the model itself, and a real-time thread
doing that would take its core from Triton's threads. Needs CAP_SYS_NICE and real-time bandwidth
for the process's cgroup; without them the threads keep their normal priority and the adapter
logs why. The H200 device machines refuse it even to root (EPERM, issue 34's eleventh round), so
its effect on the server is not measured; served 0. No Triton import.
"""

from __future__ import annotations

import os
import threading
from typing import Mapping, Optional

from ..contract.parameters import parse_parameter

PARAMETERS = ("engine_rt_priority", "vocoder_rt_priority")


def rt_priority(parameters: Mapping[str, str], name: str) -> int:
    """The SCHED_FIFO priority `name` asks for (1-99; 0 = the normal policy)."""
    value = parse_parameter(name, parameters[name], "int") if name in parameters else 0
    if not 0 <= value <= 99:
        raise ValueError(f"parameter {name}={value} must lie in [0, 99] (0 = off)")
    return int(value)


def give_rt_priority(thread: Optional[threading.Thread], priority: int) -> Optional[str]:
    """Run a started `thread` under SCHED_FIFO at `priority` (0: leave it). Returns why not, or None."""
    if priority <= 0:
        return None
    if thread is None or thread.native_id is None or not thread.is_alive():
        return "the thread is not running"
    try:
        os.sched_setscheduler(thread.native_id, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except (OSError, AttributeError) as exc:  # EPERM without CAP_SYS_NICE; no such call off Linux
        return f"SCHED_FIFO {priority} refused: {exc}"
    return None


def rt_priorities(parameters: Mapping[str, str]) -> dict[str, int]:
    """{parameter: priority} for PARAMETERS, read once when the model loads (bad values raise ValueError)."""
    return {name: rt_priority(parameters, name) for name in PARAMETERS}


def give_threads_priority(priorities: Mapping[str, int], is_gpu: bool,
                          threads: Mapping[str, Optional[threading.Thread]]) -> list[str]:
    """Give each of `threads` ({parameter: thread}) its priority, on a GPU only; returns why any was
    not given (the adapter logs it: that thread keeps its normal priority). A None thread is one this
    layout does not run (the vocoder over BLS): nothing to give."""
    if not is_gpu:
        return []
    return [f"{name}: {problem}" for name, thread in threads.items()
            if thread is not None and (problem := give_rt_priority(thread, priorities.get(name, 0))) is not None]
