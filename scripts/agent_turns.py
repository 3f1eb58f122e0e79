"""The agent-style check of the two plugins (plugins/, docs/voice_agents.md) against a running
server, run by scripts/check_agents.py.

Per framework, `runs` times each, interleaved so both see the same machine:
- an interrupted conversation on one TTS instance: answer 1 pushed word by word and interrupted
  once it has handed on INTERRUPT_AFTER_S of audio, then answer 2 started at once;
- a fresh conversation: answer 2 alone on a new TTS instance, so on a fresh socket.
A WebSocket recorder between plugin and shim (ws_recorder.py) sees the sockets and each context's
messages. A run passes when both answers went over one socket, answer 1's context was cancelled
(its `done` says so), the server sent at most one chunk of its audio after the cancel passed (a
chunk: the largest audio message of that context), the framework handed on at most one chunk of
it after the interruption, and answer 2 was spoken to its `done`. The framework passes when every
run does and answer 2's time to first audio after the interruption has a p50 within
TTFA_TOLERANCE of the fresh socket's (time from its first word to its first audio handed on).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from agent_drivers import CONVERSATIONS, Answer, Turn
from ws_recorder import WsRecorder

ANSWER_1 = ("Let me walk you through the whole plan, step by step. First, we look at last year's numbers. "
            "Then we compare them with this year's. After that, we decide what to change. "
            "Finally, we write it all down and share it with the team.")
ANSWER_2 = "Sure, I will stop there. What would you like to know instead?"
INTERRUPT_AFTER_S = 0.5  # of answer 1 heard when the user barges in
TTFA_TOLERANCE = (1.25, 0.02)  # answer 2's p50 may be at most 1.25 x the fresh p50 + 20 ms (a shared CPU)


def llm_tokens(text: str) -> list[str]:
    """Words with their leading space, as an LLM's tokens come."""
    return re.findall(r"\s*\S+", text)


@dataclass
class Run:
    """One conversation as the framework and the recorder saw it."""
    answers: list[Answer]
    sockets: int
    contexts: list[str]
    cancelled: bool = False  # answer 1's done says cancelled
    late_server_s: float = 0.0  # answer 1's audio the server sent after its cancel passed the recorder
    chunk_s: float = 0.0  # the largest audio message of answer 1
    cancel_to_done_s: float | None = None
    spoken_to_done: bool = False  # the last answer's done came, not cancelled
    close_socket: bool = False  # the plugin ended its socket as the protocol asks

    @property
    def late_handed_s(self) -> float:
        first = self.answers[0]
        return first.audio_after(first.interrupted_at) if first.interrupted_at else 0.0

    @property
    def last_ttfa_s(self) -> float | None:
        return self.answers[-1].ttfa_s

    @property
    def interrupted_ok(self) -> bool:
        return (self.sockets == 1 and len(self.contexts) == 2 and self.cancelled and self.spoken_to_done
                and self.late_server_s <= self.chunk_s and self.late_handed_s <= self.chunk_s
                and self.last_ttfa_s is not None)


def measured(answers: list[Answer], recorder: WsRecorder) -> Run:
    run = Run(answers, recorder.sockets, recorder.context_ids())
    run.close_socket = any(m.sender == "client" and m.type == "close_socket" for m in recorder.messages)
    if not run.contexts:
        return run
    last_done = recorder.of(run.contexts[-1], "server", "done")
    run.spoken_to_done = bool(last_done) and not last_done[0].cancelled
    if len(run.contexts) < 2:
        return run
    first = run.contexts[0]
    audio, cancels = recorder.of(first, "server", "audio"), recorder.of(first, "client", "cancel")
    done = recorder.of(first, "server", "done")
    run.chunk_s = max((m.audio_s for m in audio), default=0.0)
    run.cancelled = bool(done) and done[0].cancelled
    if cancels:
        run.late_server_s = sum(m.audio_s for m in audio if m.at > cancels[0].at)
        run.cancel_to_done_s = done[0].at - cancels[0].at if done else None
    return run


async def conversations(framework: str, base_url: str, recorder: WsRecorder, options: dict,
                        runs: int) -> tuple[list[Run], list[Run]]:
    converse = CONVERSATIONS[framework]
    interrupted = [Turn(llm_tokens(ANSWER_1), INTERRUPT_AFTER_S), Turn(llm_tokens(ANSWER_2))]
    fresh = [Turn(llm_tokens(ANSWER_2))]
    await converse(base_url, options, fresh)  # untimed: the framework's imports and first calls
    fresh_runs, interrupted_runs = [], []
    for _ in range(runs):
        for turns, into in ((fresh, fresh_runs), (interrupted, interrupted_runs)):
            recorder.reset()
            into.append(measured(await converse(base_url, options, turns), recorder))
    return fresh_runs, interrupted_runs


def p50_ms(values: list) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values) * 1000:.0f}" if values else "-"


def max_ms(values: list) -> str:
    return f"{max(values) * 1000:.0f}"


def spread_ms(values: list) -> str:
    values = [v for v in values if v is not None]
    return f"{min(values) * 1000:.0f}-{max(values) * 1000:.0f}" if values else "-"


def row(framework: str, fresh: list[Run], interrupted: list[Run]) -> tuple[str, bool]:
    after = [r.last_ttfa_s for r in interrupted]
    first = [r.last_ttfa_s for r in fresh]
    scale, slack = TTFA_TOLERANCE
    ttfa_ok = None not in after + first and statistics.median(after) <= statistics.median(first) * scale + slack
    ok = ttfa_ok and all(r.interrupted_ok for r in interrupted) and all(r.spoken_to_done for r in fresh)
    sockets = ", ".join(str(n) for n in sorted({r.sockets for r in interrupted}))
    line = (f"| {framework} | {len(interrupted)} | {sockets} "
            f"| {sum(r.cancelled for r in interrupted)}/{len(interrupted)} "
            f"| {p50_ms([r.answers[0].audio_s for r in interrupted])} "
            f"| {max_ms([r.late_server_s for r in interrupted])} / {max_ms([r.chunk_s for r in interrupted])} "
            f"| {max_ms([r.late_handed_s for r in interrupted])} "
            f"| {p50_ms([r.cancel_to_done_s for r in interrupted])} "
            f"| {p50_ms(after)} ({spread_ms(after)}) | {p50_ms(first)} ({spread_ms(first)}) "
            f"| {'pass' if ok else 'FAIL'} |")
    return line, ok


HEADER = ("| framework | interrupted runs | sockets per run | answer 1 cancelled | answer 1 heard (ms, p50) "
          "| answer 1 audio sent after its cancel / one chunk (ms, max) | handed on after the interruption (ms, max) "
          "| cancel to its done (ms, p50) | answer 2 first audio after the interruption (ms, p50 (range)) "
          "| answer 2 first audio on a fresh socket (ms, p50 (range)) | |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


async def agent_table(shim_url: str, options: dict, runs: int, verbose: bool = False) -> bool:
    recorder = WsRecorder(shim_url)
    base_url = await recorder.start()
    print(f"\nagent-style runs, options {options}: answer 1 {ANSWER_1!r} interrupted after "
          f"{INTERRUPT_AFTER_S * 1000:.0f} ms of its audio, answer 2 {ANSWER_2!r} at once\n\n{HEADER}", flush=True)
    passed = True
    try:
        for framework in CONVERSATIONS:
            fresh, interrupted = await conversations(framework, base_url, recorder, options, runs)
            line, ok = row(framework, fresh, interrupted)
            passed &= ok
            print(line, flush=True)
            if verbose:
                for r in interrupted:
                    print(f"  sockets {r.sockets}, contexts {len(r.contexts)}, cancelled {r.cancelled}, "
                          f"late {r.late_server_s * 1000:.0f}/{r.chunk_s * 1000:.0f} ms, handed "
                          f"{r.late_handed_s * 1000:.0f} ms, ttfa {p50_ms([r.last_ttfa_s])} ms, "
                          f"close_socket sent {r.close_socket}", flush=True)
    finally:
        await recorder.stop()
    return passed
