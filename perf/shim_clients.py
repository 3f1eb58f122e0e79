"""One stream of each kind the shim load sends (perf/shim_load.py), and the same load straight
over gRPC, each -> a bench_triton.StreamResult (first audio, audio seconds, underruns).

  http / http48 / sse   POST /v1/audio/speech, FRAMES frames (IGNORE_STOP), pcm at 24 kHz mono
                        (OpenAI's) / 48 kHz stereo (the server's) / SSE deltas of the 24 kHz pcm
  grpc                  the same utterance on a gRPC stream to moss_tts (bench_triton.one_stream)
  ws                    WS /v1/audio/speech/stream: a text session fed word by word at a set rate
  grpc_session          the same text session straight over gRPC (the shim's own request plan)

First audio of a text session counts from the moment its first sentence was complete: the send of
the word that confirms it (the segmenter cuts a sentence at the next word), the same moment on
both paths, since the client runs the same TextSegmenter on the same words.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass

from moss_tts.contract import tensors as contract
from moss_tts.contract.session_requests import SessionRequests
from moss_tts.contract.text_segments import TextSegmenter
from perf.bench_triton import TEXT, StreamResult

SENTENCES = ("The quick brown fox jumps over the lazy dog near the river bank.",
             "Then it runs far away into the quiet forest before the night falls.",
             "Nobody in the small village ever sees the clever fox again after that.")
OPENAI_RATE = 24000


@dataclass(frozen=True)
class Load:
    """What every stream of a level sends, and where."""
    shim_url: str = "http://127.0.0.1:8080"
    grpc_url: str = "127.0.0.1:8001"
    model: str = "moss_tts"
    frames: int = 112  # per HTTP / gRPC utterance (IGNORE_STOP)
    segment_frames: int = 40  # per text-session segment (IGNORE_STOP)
    words_per_s: float = 20.0  # text-session feed
    timeout_s: float = 120.0

    @property
    def words(self) -> list[str]:
        return " ".join(SENTENCES).split(" ")

    @property
    def segments(self) -> int:
        return len(SENTENCES)


HTTP_FORMATS = {"http": (OPENAI_RATE, 1, "audio"), "http48": (contract.SAMPLE_RATE, 2, "audio"),
                "sse": (OPENAI_RATE, 1, "sse")}


def _failed(start: float, error: str) -> StreamResult:
    now = time.perf_counter() - start
    return StreamResult(now, now, 0.0, 0, 0.0, error)


def _result(start: float, first_at: float, arrivals: list, audio_s: float, want_s: float) -> StreamResult:
    total = time.perf_counter() - start
    if not arrivals:
        return StreamResult(total, total, 0.0, 0, 0.0, "no audio")
    if abs(audio_s - want_s) > 1e-3:
        return StreamResult(arrivals[0][0] - first_at, total, audio_s, 0, 0.0, f"{audio_s:.3f} s of audio, want {want_s:.3f}")
    return StreamResult.played(arrivals[0][0] - first_at, total, audio_s, arrivals)


async def http_stream(client, load: Load, transport: str, seed: int) -> StreamResult:
    """One POST; an arrival per body piece (pcm) or per audio delta (SSE)."""
    rate, channels, stream_format = HTTP_FORMATS[transport]
    body = {"input": TEXT, "response_format": "pcm", "max_new_tokens": load.frames, "ignore_stop": True,
            "seed": seed, "sample_rate": rate, "channels": channels, "stream_format": stream_format}
    bytes_per_s = rate * channels * 2
    start = time.perf_counter()
    arrivals, total = [], 0
    async with client.stream("POST", f"{load.shim_url}/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            return _failed(start, f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        pieces = response.aiter_raw() if stream_format == "audio" else _sse_audio_bytes(response)
        async for size in _sizes(pieces):
            arrivals.append((time.perf_counter() - start, size / bytes_per_s))
            total += size
    return _result(start, 0.0, arrivals, total / bytes_per_s, load.frames / contract.FRAME_RATE)


async def _sizes(pieces):
    async for piece in pieces:
        size = piece if isinstance(piece, int) else len(piece)
        if size:
            yield size


async def _sse_audio_bytes(response):
    """The decoded size of each speech.audio.delta (base64: 3 bytes per 4 characters, less padding)."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                audio = event["audio"]
                yield len(audio) * 3 // 4 - (len(audio) - len(audio.rstrip("=")))
            elif event["type"] == "error":
                raise RuntimeError(f"SSE error event: {event['error']['message'][:200]}")


class Feeder:
    """The session's words at `words_per_s`, each through `send(delta)`, then `end()`; notes when
    the first segment became complete (the client's own TextSegmenter, fed the same deltas)."""

    def __init__(self, load: Load):
        self.load = load
        self.first_segment_at = None

    async def run(self, start: float, send, end) -> None:
        segmenter = TextSegmenter()
        words = self.load.words
        for i, word in enumerate(words):
            await asyncio.sleep(max(0.0, start + i / self.load.words_per_s - time.perf_counter()))
            delta = word if i == len(words) - 1 else word + " "
            if segmenter.push(delta) and self.first_segment_at is None:
                self.first_segment_at = time.perf_counter() - start
            await send(delta)
        if segmenter.end() and self.first_segment_at is None:
            self.first_segment_at = time.perf_counter() - start
        await end()


def _session_options(load: Load, seed: int) -> dict:
    return {"seed": seed, "max_new_tokens": load.segment_frames, "ignore_stop": True}


async def ws_session(load: Load, seed: int) -> StreamResult:
    from websockets.asyncio.client import connect

    url = load.shim_url.replace("http", "ws", 1) + "/v1/audio/speech/stream"
    start = time.perf_counter()
    feeder, arrivals, total, bytes_per_s = Feeder(load), [], 0, OPENAI_RATE * 2
    async with connect(url, max_size=None, open_timeout=load.timeout_s) as ws:
        await ws.send(json.dumps({"type": "options", **_session_options(load, seed)}))
        started = json.loads(await ws.recv())
        if started.get("type") != "session.started":
            return _failed(start, f"options refused: {started}")
        send = lambda delta: ws.send(json.dumps({"type": "text", "text": delta}))  # noqa: E731
        feeding = asyncio.ensure_future(feeder.run(start, send, lambda: ws.send('{"type":"end"}')))
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    arrivals.append((time.perf_counter() - start, len(message) / bytes_per_s))
                    total += len(message)
                elif (event := json.loads(message))["type"] in ("done", "error"):
                    if event["type"] == "error":
                        return _failed(start, f"error event: {event['error']['message'][:200]}")
                    break
        finally:
            await feeding
    want_s = load.segments * load.segment_frames / contract.FRAME_RATE
    return _result(start, feeder.first_segment_at or 0.0, arrivals, total / bytes_per_s, want_s)


async def grpc_session(client, load: Load, seed: int) -> StreamResult:
    """The WebSocket's text session, sent as the shim sends it (speech_ws.WsSession)."""
    from client.openai_shim.triton_stream import build_inputs, read_to_end

    session_id = uuid.uuid4().hex
    plan = SessionRequests({"SEED": seed, "MAX_FRAMES": load.segment_frames, "IGNORE_STOP": True, "STREAM": True})
    segmenter, queue, closed = TextSegmenter(), asyncio.Queue(), asyncio.Event()

    def request(text: str, is_end: bool) -> None:
        request_id, options = plan.next(text, is_end)
        values = {"TEXT": text, **options, "SESSION_ID": session_id, "SESSION_END": True if is_end else None}
        queue.put_nowait({"model_name": load.model, "inputs": build_inputs(values), "request_id": request_id,
                          "outputs": _audio_only(), "parameters": {"triton_enable_empty_final_response": True}})

    async def send(delta: str) -> None:
        for text in segmenter.push(delta):
            request(text, False)

    async def end() -> None:
        rest = segmenter.end()
        for i, text in enumerate(rest):
            request(text, i == len(rest) - 1)
        if not rest:
            request("", True)

    async def requests():
        while (item := await queue.get()) is not None:
            yield item
        await closed.wait()

    start = time.perf_counter()
    feeder, arrivals, total = Feeder(load), [], 0
    call = client.stream_infer(requests())
    feeding = asyncio.ensure_future(feeder.run(start, send, end))
    try:
        while True:
            result, error = await asyncio.wait_for(call.__anext__(), load.timeout_s)
            if error is not None:
                return _failed(start, error.message()[:200])
            audio = result.as_numpy("AUDIO")
            if audio is not None and audio.size:
                arrivals.append((time.perf_counter() - start, audio.shape[1] / contract.SAMPLE_RATE))
                total += audio.shape[1]
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param and response.id == plan.end_id:
                break
    finally:
        await feeding
        queue.put_nowait(None)
        await read_to_end(call, closed)
    want_s = load.segments * load.segment_frames / contract.FRAME_RATE
    return _result(start, feeder.first_segment_at or 0.0, arrivals, total / contract.SAMPLE_RATE, want_s)


def _audio_only():
    import tritonclient.grpc.aio as grpcclient

    return [grpcclient.InferRequestedOutput("AUDIO")]
