"""Pipecat's and LiveKit's OpenAI TTS, unmodified, against a running server (scripts/check_agents.sh).

Run by .agents-venv's Python (the frameworks pull numpy 2; the server's venv keeps 1.26). Each
framework gets only `base_url` (and an API key) and, per row, the one setting named there; what
it hands on to its pipeline (its audio frames: bytes, declared rate and channels) is compared
with the server's own count of frames it generated (tritonserver's metrics,
moss_engine{stat="frames_generated"}, read once the server is idle before and after each
utterance). A transparent recording proxy between framework and shim captures the exact request
bodies and the response headers; the frameworks never know it is there.

A row passes when every utterance's audio lasts the server's frames x 80 ms within one frame and
the frames' rate and channels are the ones the response's bytes carry (its X-Sample-Rate and
X-Channels headers) and the ones the framework declares.

Then this repository's own plugins (plugins/), agent-style: scripts/agent_turns.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
import urllib.request
import warnings
from dataclasses import dataclass, field

from aiohttp import web

from agent_turns import agent_table
from ws_recorder import LocalProxy

FRAME_S = 0.08  # one codec frame
TEXTS = ("Hello there. This is a check of the speech path.", "Voice agents speak through OpenAI compatible services.",
         "The quick brown fox jumps over the lazy dog.", "One more sentence, to be sure.",
         "Numbers too: one, two, three.", "And the last one ends here.")
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding", "host", "keep-alive"}
FRAMES_SERIES = re.compile(r'^moss_engine\{[^}]*stat="frames_generated"[^}]*\} (\S+)$', re.M)
IN_FLIGHT_SERIES = re.compile(r'^moss_tts_requests\{[^}]*stat="in_flight"[^}]*\} (\S+)$', re.M)


@dataclass
class Exchange:
    """One request through the proxy."""
    body: dict
    status: int = 0
    content_type: str = ""
    rate_channels: tuple = ()
    body_bytes: int = 0


@dataclass
class Utterance:
    exchanges: list = field(default_factory=list)
    error: str = ""  # what the framework raised, if it did
    frames: list = field(default_factory=list)  # (samples per channel, rate, channels) handed on
    declared: set = field(default_factory=set)  # (rate, channels) the framework says its audio has
    server_frames: int = 0

    @property
    def handed_s(self) -> float:
        return sum(samples / rate for samples, rate, _ in self.frames)

    @property
    def layouts(self) -> set:
        return {(rate, channels) for _, rate, channels in self.frames}


class RecordingProxy(LocalProxy):
    """Forwards every request to the shim as it is, streams the answer back, records both."""

    def __init__(self, shim_url: str):
        self.shim_url, self.exchanges = shim_url.rstrip("/"), []

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{path:.*}", self.forward)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        exchange = Exchange(json.loads(body) if body.startswith(b"{") else {})
        self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(request.method, self.shim_url + request.path_qs, data=body,
                                         headers=headers) as upstream:
            exchange.status, exchange.content_type = upstream.status, upstream.headers.get("Content-Type", "")
            exchange.rate_channels = (upstream.headers.get("X-Sample-Rate"), upstream.headers.get("X-Channels"))
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                exchange.body_bytes += len(data)
                await response.write(data)
            await response.write_eof()
            return response


def metric_sum(metrics_url: str, series: re.Pattern) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return sum(float(value) for value in series.findall(text))


def settled_frames(metrics_url: str, timeout_s: float = 30.0) -> int:
    """The server's generated-frames counter once nothing is in flight and two reads 0.6 s apart
    agree (the gauges are published a few times a second)."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        frames = metric_sum(metrics_url, FRAMES_SERIES)
        if frames == last and metric_sum(metrics_url, IN_FLIGHT_SERIES) == 0:
            return int(frames)
        last = frames
        time.sleep(0.6)
    raise RuntimeError(f"the server did not settle within {timeout_s:g} s ({metrics_url})")


async def pipecat_speak(base_url: str, text: str, setting: dict) -> tuple[list, set]:
    from pipecat.frames.frames import EndFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.workers.runner import WorkerRunner

    frames = []

    class Collect(FrameProcessor):  # the next processor of an agent's pipeline (a transport's output)
        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                frames.append((frame.num_frames, frame.sample_rate, frame.num_channels))
            await self.push_frame(frame, direction)

    tts = OpenAITTSService(base_url=base_url, api_key="unused", **setting)
    worker = PipelineWorker(Pipeline([tts, Collect()]))
    await worker.queue_frames([TTSSpeakFrame(text), EndFrame()])
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()
    return frames, {(rate, channels) for _, rate, channels in frames}  # each frame states its own


async def livekit_speak(base_url: str, text: str, setting: dict) -> tuple[list, set]:
    from livekit.plugins import openai

    tts = openai.TTS(base_url=base_url, api_key="unused", **setting)
    frames = []
    try:
        async with tts.synthesize(text) as stream:
            async for audio in stream:
                frame = audio.frame
                frames.append((frame.samples_per_channel, frame.sample_rate, frame.num_channels))
    finally:
        await tts.aclose()
    return frames, {(tts.sample_rate, tts.num_channels)}  # what the plugin tells the agent it produces


FRAMEWORKS = {"Pipecat": pipecat_speak, "LiveKit": livekit_speak}
# (framework, setting label, keyword arguments beyond base_url and the API key)
ROWS = [("Pipecat", "defaults", {}),
        ("Pipecat", "model=tts-1", {"settings_model": "tts-1"}),
        ("LiveKit", "defaults", {}),
        ("LiveKit", "response_format=pcm", {"response_format": "pcm"}),
        ("LiveKit", "response_format=wav", {"response_format": "wav"}),
        ("LiveKit", "response_format=mp3", {"response_format": "mp3"}),
        ("LiveKit", "model=tts-1", {"model": "tts-1"}),
        ("LiveKit", "model=tts-1, pcm", {"model": "tts-1", "response_format": "pcm"}),
        ("LiveKit", "response_format=opus", {"response_format": "opus"}),
        ("LiveKit", "response_format=aac", {"response_format": "aac"}),
        ("LiveKit", "response_format=flac", {"response_format": "flac"})]


def framework_kwargs(framework: str, setting: dict) -> dict:
    if framework == "Pipecat" and "settings_model" in setting:  # Pipecat's non-deprecated way to set it
        from pipecat.services.openai.tts import OpenAITTSService

        return {"settings": OpenAITTSService.Settings(model=setting["settings_model"])}
    return setting


async def run_row(framework: str, setting: dict, proxy: RecordingProxy, base_url: str, metrics_url: str) -> list:
    utterances = []
    for text in TEXTS:
        before = settled_frames(metrics_url)
        proxy.exchanges = []
        try:
            frames, declared, error = *await FRAMEWORKS[framework](base_url, text, framework_kwargs(framework, setting)), ""
        except Exception as exc:  # LiveKit gives up on an utterance without audio: consistent if the server made none
            frames, declared, error = [], set(), f"{type(exc).__name__}: {exc}"
        utterances.append(Utterance(proxy.exchanges, error, frames, declared, settled_frames(metrics_url) - before))
    return utterances


def row_line(framework: str, label: str, utterances: list) -> tuple[str, bool]:
    exchanges = [x for u in utterances for x in u.exchanges]
    sent = exchanges[0].body if exchanges else {}
    request = ", ".join(f"{k}={sent[k]}" for k in ("model", "response_format", "stream_format", "speed") if k in sent)
    served = {(int(x.rate_channels[0]), int(x.rate_channels[1])) for x in exchanges if x.rate_channels[0]}
    handed = set().union(*(u.layouts | u.declared for u in utterances))
    errors = [abs(u.handed_s - u.server_frames * FRAME_S) for u in utterances]
    server_frames = sum(u.server_frames for u in utterances)
    ok = (all(x.status == 200 for x in exchanges) and len(handed | served) == 1 and max(errors) <= FRAME_S + 1e-9
          and server_frames > 0 and not any(u.error and u.server_frames for u in utterances))
    layout = lambda pairs: ", ".join(f"{r} Hz/{c} ch" for r, c in sorted(pairs)) or "-"
    line = (f"| {framework} | {label} | {request}; {exchanges[0].content_type.split(';')[0] if exchanges else '-'} "
            f"| {sum(x.body_bytes for x in exchanges):,} | {layout(served)} | {layout(handed)} "
            f"| {sum(u.handed_s for u in utterances):.3f} | {server_frames} = {server_frames * FRAME_S:.2f} "
            f"| {max(errors) * 1000:.0f} | {'pass' if ok else 'FAIL'} |")
    return line, ok


HEADER = ("| framework | setting (only base_url and api_key besides) | request sent; response type | body bytes "
          "| bytes carry (response headers) | frames handed on, as declared | audio handed on (s) | server frames = s "
          "| worst utterance diff (ms) | |\n|---|---|---|---|---|---|---|---|---|---|")


def quiet_frameworks() -> None:
    """Their own logs at errors only (both are chatty at INFO/DEBUG)."""
    from loguru import logger  # Pipecat's

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    logging.basicConfig(level=logging.ERROR)  # LiveKit's
    warnings.filterwarnings("ignore", category=DeprecationWarning)


async def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shim-url", required=True)
    p.add_argument("--metrics-url", required=True)
    p.add_argument("--bodies", action="store_true", help="also print each row's request bodies (and each agent run)")
    p.add_argument("--only", choices=("openai", "agents"), help="only the OpenAI TTS rows, or only the plugins' runs")
    p.add_argument("--agent-runs", type=int, default=5, help="interrupted and fresh conversations per framework")
    # The demo checkpoint stops at random: a fixed length per segment makes answer 1 long enough to interrupt.
    p.add_argument("--agent-options", type=json.loads, default={"seed": 7, "ignore_stop": True, "max_new_tokens": 12},
                   help="the plugins' options message fields (JSON)")
    args = p.parse_args(argv)
    quiet_frameworks()
    passed = True
    if args.only != "agents":
        passed &= await openai_rows(args)
    if args.only != "openai":
        passed &= await agent_table(args.shim_url, args.agent_options, args.agent_runs, args.bodies)
    return 0 if passed else 1


async def openai_rows(args) -> bool:
    proxy = RecordingProxy(args.shim_url)
    base_url = await proxy.start() + "/v1"
    print(f"{len(TEXTS)} utterances per row: {', '.join(repr(t) for t in TEXTS)}\n\n{HEADER}", flush=True)
    passed = True
    try:
        for framework, label, setting in ROWS:
            utterances = await run_row(framework, setting, proxy, base_url, args.metrics_url)
            line, ok = row_line(framework, label, utterances)
            passed &= ok
            print(line, flush=True)
            if args.bodies:
                print("  bodies: " + "; ".join(json.dumps({k: v for k, v in x.body.items() if k != "input"})
                                               for u in utterances[:1] for x in u.exchanges), flush=True)
                print("  per utterance: " + "; ".join(f"{u.handed_s:.3f} s handed on / {u.server_frames} frames"
                                                      f"{' (' + u.error + ')' if u.error else ''}"
                                                      for u in utterances), flush=True)
    finally:
        await proxy.stop()
    return passed


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
