"""The OpenAI shim's in-band STOP without Triton (client/openai_shim/call_reader.py, AudioStream in
triton_stream.py): a fake `stream_infer` call plays the server's side of the protocol (chunks, a
[CANCELLED] error and an empty final when a STOP names the request, its status once half-closed),
so the tests see what reaches the "server" and whether the call was ever cancelled."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from client.openai_shim.call_reader import ENDINGS, CallReader
from client.openai_shim.triton_stream import AudioStream


class Parameter:
    def __init__(self, value: bool) -> None:
        self.bool_param = value


class Response:
    def __init__(self, request_id: str, final: bool) -> None:
        self.id = request_id
        self.parameters = {"triton_final_response": Parameter(final)}


class Result:
    def __init__(self, request_id: str, audio, final: bool) -> None:
        self.response, self.audio = Response(request_id, final), audio

    def get_response(self):
        return self.response

    def as_numpy(self, name):
        return self.audio


class Error:
    def __init__(self, message: str) -> None:
        self.text = message

    def message(self):
        return self.text


class FakeCall:
    """The server's side: `chunks` chunks `gap_s` apart for the first request (then its final flag);
    a STOP request ends it with [CANCELLED] and gets its own empty final (unless `answers_stop` is
    False); the half-close ends the call once every request has ended."""

    def __init__(self, requests, chunks: int = 50, gap_s: float = 0.01, answers_stop: bool = True) -> None:
        self.requests, self.chunks, self.gap_s, self.answers_stop = requests, chunks, gap_s, answers_stop
        self.out: asyncio.Queue = asyncio.Queue()
        self.seen: list[dict] = []
        self.is_cancelled = self.half_closed = False
        self._server = asyncio.ensure_future(self._serve())

    async def _serve(self):
        speaking = None
        async for request in self.requests:
            self.seen.append(request)
            if "STOP" not in {i.name() for i in request["inputs"]}:
                speaking = asyncio.ensure_future(self._speak(request["request_id"]))
            elif self.answers_stop:
                if speaking is not None and not speaking.done():
                    speaking.cancel()
                    self.out.put_nowait((None, Error("[CANCELLED] request cancelled by the client")))
                self.out.put_nowait((Result(request["request_id"], None, True), None))
        self.half_closed = True
        if speaking is not None:
            await asyncio.gather(speaking, return_exceptions=True)
        self.out.put_nowait(StopAsyncIteration())

    async def _speak(self, request_id):
        for i in range(self.chunks):
            await asyncio.sleep(self.gap_s)
            self.out.put_nowait((Result(request_id, np.full((2, 4), i, np.float32), i == self.chunks - 1), None))

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.out.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self):
        self.is_cancelled = True
        self._server.cancel()
        self.out.put_nowait(asyncio.CancelledError())
        return True


class FakeClient:
    def __init__(self, **call_options) -> None:
        self.call_options, self.calls = call_options, []

    def stream_infer(self, requests):
        self.calls.append(FakeCall(requests, **self.call_options))
        return self.calls[-1]


def audio_stream(client, **options) -> AudioStream:
    return AudioStream(client, "moss_tts", [], response_timeout_s=options.pop("timeout", 5.0), **options)


def is_stop(request) -> bool:
    return "STOP" in {i.name() for i in request["inputs"]}


def test_a_stream_left_early_is_stopped_in_band_and_half_closed_never_cancelled():
    async def run():
        client = FakeClient()
        stream = audio_stream(client)
        assert (await anext(stream)).shape == (2, 4)
        await stream.aclose()
        call = client.calls[0]
        stop = [r for r in call.seen if is_stop(r)]
        assert len(stop) == 1 and stop[0]["request_id"] == call.seen[0]["request_id"] + ".stop"
        assert stream.ended_by == "stopped" and call.half_closed and not call.is_cancelled
        await stream.aclose()  # twice: nothing more
        assert len([r for r in call.seen if is_stop(r)]) == 1
    asyncio.run(run())


def test_a_consumer_cancelled_while_it_waits_never_cancels_the_call():
    """The HTTP client leaves while the shim awaits the next chunk: grpc.aio would cancel the RPC if
    that await were the call's own read; here it is the queue's."""
    async def run():
        client = FakeClient(gap_s=0.05)
        stream = audio_stream(client)
        await anext(stream)
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await stream.aclose()
        assert stream.ended_by == "stopped" and not client.calls[0].is_cancelled
    asyncio.run(run())


async def closing_after_a_chunk(gap_s: float):
    """A stream that spoke one chunk, and its aclose() begun (not yet done): (client, stream, task)."""
    client = FakeClient(gap_s=gap_s)
    stream = audio_stream(client)
    await anext(stream)
    closing = asyncio.ensure_future(stream.aclose())
    await asyncio.sleep(0)
    return client, stream, closing


def test_an_ending_outlives_a_cancelled_caller():
    async def run():
        client, stream, closing = await closing_after_a_chunk(0.05)
        closing.cancel()  # the handler is torn down while aclose() waits
        await asyncio.gather(closing, return_exceptions=True)
        assert ENDINGS  # the ending goes on by itself
        await asyncio.wait(set(ENDINGS), timeout=5.0)
        assert stream.ended_by == "stopped" and client.calls[0].half_closed and not client.calls[0].is_cancelled
    asyncio.run(run())


def test_a_stop_not_answered_in_time_falls_back_to_a_grpc_cancel():
    async def run():
        client = FakeClient(answers_stop=False, gap_s=1.0)
        stream = audio_stream(client, stop_wait_s=0.2)
        started = time.monotonic()
        await stream.aclose()
        assert stream.ended_by == "cancelled" and client.calls[0].is_cancelled
        assert time.monotonic() - started < 2.0
    asyncio.run(run())


def test_a_request_that_ended_by_itself_is_neither_stopped_nor_cancelled():
    async def run():
        client = FakeClient(chunks=2, gap_s=0.001)
        stream = audio_stream(client)
        chunks = [chunk async for chunk in stream]
        assert len(chunks) == 2
        await stream.aclose()
        call = client.calls[0]
        assert stream.ended_by is None and not any(is_stop(r) for r in call.seen)
        assert call.half_closed and not call.is_cancelled
    asyncio.run(run())


def test_a_second_reader_during_the_ending_cannot_steal_its_finals():
    """A consumer still iterating while aclose() runs gets nothing more; the ending's count of the
    finals is the reader task's, so the STOP is still seen answered."""
    async def run():
        client, stream, closing = await closing_after_a_chunk(0.02)
        assert await anext(stream, "ended") == "ended"
        await closing
        assert stream.ended_by == "stopped" and not client.calls[0].is_cancelled
    asyncio.run(run())


def test_the_reader_counts_finals_and_their_ids_before_any_consumer():
    async def run():
        client = FakeClient(chunks=3, gap_s=0.001)
        reader = CallReader(client.stream_infer(_one_request()))
        assert await reader.until_finals(1, 5.0)
        assert reader.finals == 1 and reader.final_ids == {"r1"}
        assert not await reader.until_finals(2, 0.05)  # no second final comes
    asyncio.run(run())


async def _one_request():
    yield {"model_name": "moss_tts", "inputs": [], "request_id": "r1"}
    await asyncio.sleep(3600)


@pytest.mark.parametrize("loops", [30])
def test_stop_flow_in_a_loop_under_a_tiny_switch_interval(loops):
    """The same ending, many times, with the interpreter switching threads as often as it can (the
    fake server and the shim share one event loop; this shakes the order of its callbacks)."""
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        async def run():
            for i in range(loops):
                client = FakeClient(gap_s=0.002 * (i % 3 + 1))
                stream = audio_stream(client)
                for _ in range(i % 4):
                    await anext(stream)
                await stream.aclose()
                assert stream.ended_by == "stopped" and not client.calls[0].is_cancelled, i
        asyncio.run(run())
    finally:
        sys.setswitchinterval(interval)
