"""A voice agent's turns, driven through each framework the way its own agent loop drives a TTS
(scripts/agent_turns.py): the LLM's words pushed one by one, and, for an answer the user
interrupts, the interruption issued once that answer has handed on `interrupt_after_s` of audio.

LiveKit: as `Agent.default.tts_node` does, `async with tts.stream()`, words pushed by a task, frames
read until the node is interrupted: the read stops and the stream is closed (aclose).
Pipecat: a pipeline [MossTTSService, Probe] in a PipelineWorker; LLMFullResponseStartFrame,
LLMTextFrames, LLMFullResponseEndFrame per answer; the interruption is an InterruptionFrame
queued into the pipeline, as the worker does for a user who starts speaking.
Each conversation runs on a new TTS instance, so its first answer opens a fresh socket.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

WORD_S = 0.03  # between two words: an LLM writing ~33 tokens a second
TURN_TIMEOUT_S = 120.0


@dataclass
class Turn:
    words: list[str]
    interrupt_after_s: float | None = None  # None: the answer is spoken to its end


@dataclass
class Answer:
    first_push: float = 0.0  # time.perf_counter() of its first word
    audio: list[tuple[float, float]] = field(default_factory=list)  # (when handed on, seconds)
    interrupted_at: float | None = None

    @property
    def ttfa_s(self) -> float | None:
        return self.audio[0][0] - self.first_push if self.audio else None

    @property
    def audio_s(self) -> float:
        return sum(seconds for _, seconds in self.audio)

    def audio_after(self, moment: float) -> float:
        return sum(seconds for at, seconds in self.audio if at > moment)


async def livekit_conversation(base_url: str, options: dict, turns: list[Turn]) -> list[Answer]:
    import aiohttp
    from livekit.plugins import moss_tts

    answers = []
    async with aiohttp.ClientSession() as session:
        tts = moss_tts.TTS(base_url=base_url, options=options, http_session=session)
        try:
            for turn in turns:
                answers.append(await asyncio.wait_for(_livekit_turn(tts, turn), TURN_TIMEOUT_S))
        finally:
            await tts.aclose()
    return answers


async def _livekit_turn(tts, turn: Turn) -> Answer:
    answer = Answer()

    async with tts.stream() as stream:
        async def forward_input() -> None:
            answer.first_push = time.perf_counter()
            for word in turn.words:
                stream.push_text(word)
                await asyncio.sleep(WORD_S)
            stream.end_input()

        forward = asyncio.create_task(forward_input())
        try:
            async for event in stream:
                answer.audio.append((time.perf_counter(), event.frame.duration))
                if turn.interrupt_after_s is not None and answer.audio_s >= turn.interrupt_after_s:
                    answer.interrupted_at = time.perf_counter()
                    break  # the tts_node's consumer is cancelled: the stream closes below
        finally:
            forward.cancel()
    return answer


async def pipecat_conversation(base_url: str, options: dict, turns: list[Turn]) -> list[Answer]:
    from pipecat.frames.frames import (EndFrame, InterruptionFrame, LLMFullResponseEndFrame,
                                       LLMFullResponseStartFrame, LLMTextFrame, TTSAudioRawFrame,
                                       TTSStoppedFrame)
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.workers.runner import WorkerRunner
    from pipecat_moss_tts import MossTTSService

    answers = [Answer() for _ in turns]
    contexts: list[str] = []  # in the order their audio appeared: one per answer
    heard = [asyncio.Event() for _ in turns]  # enough of the answer to interrupt it, or all of it

    class Probe(FrameProcessor):  # where an agent's output transport would be
        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame) and frame.context_id:
                if frame.context_id not in contexts:
                    contexts.append(frame.context_id)
                index = contexts.index(frame.context_id)
                answers[index].audio.append((time.perf_counter(), frame.num_frames / frame.sample_rate))
                limit = turns[index].interrupt_after_s
                if limit is not None and answers[index].audio_s >= limit:
                    heard[index].set()
            elif isinstance(frame, TTSStoppedFrame) and frame.context_id in contexts:
                heard[contexts.index(frame.context_id)].set()
            await self.push_frame(frame, direction)

    tts = MossTTSService(base_url=base_url, sample_rate=24000, options=options)
    worker = PipelineWorker(Pipeline([tts, Probe()]))

    async def converse() -> None:
        try:
            for index, turn in enumerate(turns):
                await worker.queue_frame(LLMFullResponseStartFrame())
                answers[index].first_push = time.perf_counter()
                for word in turn.words:
                    if heard[index].is_set():
                        break  # the user barged in while the LLM was still writing
                    await worker.queue_frame(LLMTextFrame(word))
                    await asyncio.sleep(WORD_S)
                if not heard[index].is_set():
                    await worker.queue_frame(LLMFullResponseEndFrame())
                await asyncio.wait_for(heard[index].wait(), TURN_TIMEOUT_S)
                if turn.interrupt_after_s is not None:
                    answers[index].interrupted_at = time.perf_counter()
                    await worker.queue_frame(InterruptionFrame())
        finally:
            await worker.queue_frame(EndFrame())  # the worker ends once the last audio is out

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    talk = asyncio.create_task(converse())
    await asyncio.wait_for(runner.run(), TURN_TIMEOUT_S * len(turns))
    await talk  # its error, if it had one
    return answers


CONVERSATIONS = {"LiveKit": livekit_conversation, "Pipecat": pipecat_conversation}
