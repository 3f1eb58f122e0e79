"""The soak's load: one client process's concurrent streams (perf/soak.py runs it in one or more
processes, soak_clients.py). Every worker runs one request after another until the time is up. A
request is, by chance: a cancel (before its first response or after 1-3 chunks; by the gRPC
stream's cancel, or, for `stop_share` of them, by an in-band STOP as the OpenAI shim sends it:
client/openai_shim/triton_stream.AudioStream), a bad input (must end in one INVALID_ARGUMENT error, or Triton's own rejection for a
wrong dtype), or a normal request: streamed audio, STREAM=false, CODES only, a clone, a
continuation, or the moss_tts_codes ensemble. Normal requests use IGNORE_STOP, so their length is
known and checked. Every PROGRESS_S a progress line goes to stderr.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np


from moss_tts.contract import tensors as contract

SPF = contract.SAMPLES_PER_FRAME
BAD_INPUTS = [({"TEXT": ""}, "TEXT is empty"), ({"TOP_P": 5.0}, "top_p must be in"),
              ({"MAX_FRAMES": 0}, "max_frames must be in"), ({"MODE": "sing"}, "MODE must be one of"),
              ({"MODE": "continuation"}, "continuation needs"),
              ({"REFERENCE_AUDIO": b"RIFF not audio"}, "could not be decoded"),
              ({"TOP_K": ("FP32", 3.0)}, None)]  # a wrong dtype: Triton itself rejects it
PROGRESS_S = 10.0  # seconds between a client process's progress lines
STOP_POLL_S = 0.5  # seconds between a client process's looks at the stop flag


@dataclass(frozen=True)
class SoakConfig:
    url: str
    concurrency: int
    seconds: float
    cancel_fraction: float = 0.2
    bad_fraction: float = 0.1
    min_frames: int = 6
    max_frames: int = 30
    response_timeout_s: float = 120.0
    seed: int = 0
    stop_share: float = 0.5  # of the cancelled requests, those ended by an in-band STOP, not a gRPC cancel


@dataclass
class SoakReport:
    outcomes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    first_audio_s: list[float] = field(default_factory=list)
    audio_seconds: float = 0.0
    wall_seconds: float = 0.0
    end_state: dict = field(default_factory=dict)
    end_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and not self.end_problems

    def summary(self) -> dict:
        ttfa = sorted(self.first_audio_s)
        pct = (lambda q: round(ttfa[min(len(ttfa) - 1, int(q * len(ttfa)))] * 1000, 1) if ttfa else None)
        return {"ok": self.ok, "requests": sum(self.outcomes.values()), "outcomes": dict(self.outcomes),
                "failures": self.failures[:20], "num_failures": len(self.failures),
                "first_audio_ms_p50": pct(0.5), "first_audio_ms_p95": pct(0.95),
                "audio_seconds": round(self.audio_seconds, 1), "wall_seconds": round(self.wall_seconds, 1),
                "end_state": self.end_state, "end_problems": self.end_problems}


def tone_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def make_inputs(values: dict, ensemble: bool = False):
    import tritonclient.grpc.aio as grpcclient

    inputs = []
    for name, value in values.items():
        shape = [1, 1] if ensemble and name == "REFERENCE_AUDIO" else [1]
        if isinstance(value, tuple):  # (forced dtype, value): a deliberately wrong type
            dtype, value = value
            array = np.array([value], dtype=contract.NUMPY_DTYPES[dtype])
        else:
            dtype, array = contract.INPUTS[name].dtype, contract.input_array(name, value, shape)
        tensor = grpcclient.InferInput(name, shape, dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def say(text: str) -> None:
    """One line to stderr at once: the soak's log is what is left when a run goes wrong."""
    print(text, file=sys.stderr, flush=True)


def rss_mib() -> float:
    """This process's resident memory in MiB (/proc/self/statm counts pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Soak:
    def __init__(self, config: SoakConfig, client, reference: bytes, label: str = "soak client 0") -> None:
        self.config = config
        self.client = client
        self.reference = reference
        self.label = label  # names this client process in its stderr lines
        self.report = SoakReport()
        self.deadline = float("inf")  # monotonic; moved to now when the client processes are told to stop
        self.busy_since: dict[int, float] = {}  # worker index -> monotonic start of its request in flight

    async def request(self, model: str, values: dict, outputs: Optional[list[str]] = None, cancel_after=None,
                      ensemble: bool = False):
        """-> (responses, error message or None, first response seconds). cancel_after: ("delay", s)
        or ("chunks", n): cancel the gRPC stream then."""
        import tritonclient.grpc.aio as grpcclient

        from client.openai_shim.triton_stream import read_to_end

        closed = asyncio.Event()
        request = {"model_name": model, "inputs": make_inputs(values, ensemble),
                   "parameters": {"triton_enable_empty_final_response": True}}
        if outputs:
            request["outputs"] = [grpcclient.InferRequestedOutput(name) for name in outputs]

        async def requests():
            yield request
            await closed.wait()  # half-closing early would end the stream before its responses

        call = self.client.stream_infer(requests())
        start, first, responses = time.perf_counter(), None, []
        canceller = None
        if cancel_after and cancel_after[0] == "delay":
            canceller = asyncio.get_running_loop().call_later(cancel_after[1], call.cancel)

        async def ended(error: Optional[str]):
            # The request is over: no cancel from here on, the stream is read to its status (a
            # cancel now, or closing the channel before the status came, can leave tritonserver
            # holding moss_tts at shutdown: perf/hold_repro/README.md).
            if canceller is not None:
                canceller.cancel()
            await read_to_end(call, closed)
            return responses, error, first

        try:
            while True:
                result, error = await asyncio.wait_for(call.__anext__(), self.config.response_timeout_s)
                first = first if first is not None else time.perf_counter() - start
                if error is not None:
                    return await ended(error.message())
                responses.append(result)
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return await ended(None)
                if cancel_after and cancel_after[0] == "chunks" and len(responses) >= cancel_after[1]:
                    call.cancel()
                    return responses, "cancelled by us", first
        except (StopAsyncIteration, asyncio.CancelledError):
            return responses, "cancelled by us", first
        except asyncio.TimeoutError:
            call.cancel()
            return responses, f"no response for {self.config.response_timeout_s:.0f} s", first
        except Exception as exc:  # grpc errors after our own cancel, mostly
            return responses, f"{type(exc).__name__}: {exc}", first
        finally:
            if canceller is not None:
                canceller.cancel()
            closed.set()

    async def one(self, rng: random.Random) -> None:
        roll = rng.random()
        if roll < self.config.cancel_fraction:
            await self.cancelled(rng)
        elif roll < self.config.cancel_fraction + self.config.bad_fraction:
            await self.bad(rng)
        else:
            await self.normal(rng)

    async def cancelled(self, rng: random.Random) -> None:
        frames = self.config.max_frames * 4  # long enough to still be running when cancelled
        how = ("delay", rng.uniform(0.0, 0.5)) if rng.random() < 0.3 else ("chunks", rng.randint(1, 3))
        values = {"TEXT": "This will be cut short.", "SEED": rng.randrange(1 << 30), "MAX_FRAMES": frames,
                  "IGNORE_STOP": True, "FIRST_CHUNK_FRAMES": 2, "CHUNK_FRAMES": 4}
        if rng.random() < self.config.stop_share:
            await self.stopped(values, how)
            return
        _, error, _ = await self.request("moss_tts", values, cancel_after=how)
        if error is None:  # finished before the cancel landed: fine, but say so
            self.report.outcomes["cancel came too late"] += 1
        elif error == "cancelled by us" or "CANCELLED" in error:
            self.report.outcomes["cancelled"] += 1
        else:
            self.fail("cancel", error)

    async def stopped(self, values: dict, how) -> None:
        """A request ended early by the OpenAI shim's own code (AudioStream.aclose: an in-band STOP,
        both finals read, the stream half-closed); the gRPC fallback cancel is a failure here."""
        from client.openai_shim import errors as shim_errors
        from client.openai_shim.triton_stream import AudioStream, build_inputs

        stream = AudioStream(self.client, "moss_tts", build_inputs(values), self.config.response_timeout_s)
        try:
            if how[0] == "delay":
                await asyncio.sleep(how[1])
            else:
                for _ in range(how[1]):
                    if await anext(stream, None) is None:
                        break
        except shim_errors.ApiError as exc:
            self.fail("stop", f"before the stop: {exc}")
            return
        finally:
            await stream.aclose()
        if stream.ended_by is None:
            self.report.outcomes["stop came too late"] += 1  # ended by itself first: fine, but say so
        elif stream.ended_by == "stopped":
            self.report.outcomes["stopped"] += 1
        else:  # "cancelled": the STOP unanswered in 5 s; "call ended": the server ended the stream first
            self.fail("stop", f"the STOP was not answered: the stream {stream.ended_by}")

    async def bad(self, rng: random.Random) -> None:
        bad, expected = rng.choice(BAD_INPUTS)
        values = {"TEXT": "Hello.", "MAX_FRAMES": 4, "IGNORE_STOP": True, **bad}
        _, error, _ = await self.request("moss_tts", values)
        if error is None:
            self.fail("bad input", f"{bad} was accepted")
        elif expected is None or (error.startswith("[INVALID_ARGUMENT]") and expected in error):
            self.report.outcomes["bad input rejected"] += 1
        else:
            self.fail("bad input", f"{bad}: {error}")

    async def normal(self, rng: random.Random) -> None:
        frames = rng.randint(self.config.min_frames, self.config.max_frames)
        kind = rng.choice(["stream", "stream", "stream", "offline", "codes", "clone", "continuation", "ensemble"])
        values = {"TEXT": f"Soak request {rng.randrange(10**6)}.", "SEED": rng.randrange(1 << 30),
                  "MAX_FRAMES": frames, "IGNORE_STOP": True}
        model, outputs, output, ensemble = "moss_tts", ["AUDIO"], "AUDIO", False
        if kind == "offline":
            values["STREAM"] = False
        elif kind == "codes":
            outputs, output = ["CODES"], "CODES"
        elif kind in ("clone", "continuation"):
            values["REFERENCE_AUDIO"] = self.reference
            if kind == "continuation":
                values.update(MODE="continuation", REFERENCE_TEXT="A reference. ")
        elif kind == "ensemble":
            model, outputs, output, ensemble = "moss_tts_codes", ["CODES"], "CODES", True
            values["REFERENCE_AUDIO"] = b""
        responses, error, first = await self.request(model, values, outputs, ensemble=ensemble)
        if error is not None:
            if "busy" in error:
                self.report.outcomes["busy"] += 1
                await asyncio.sleep(0.2)  # back off as a real client would, instead of spinning
            else:
                self.fail(kind, error)
            return
        arrays = [r.as_numpy(output) for r in responses if r.as_numpy(output) is not None]
        got = sum(a.shape[1] // SPF if output == "AUDIO" else a.shape[0] for a in arrays)
        if got != frames:
            self.fail(kind, f"{got} frames came back, {frames} were asked for")
            return
        self.report.outcomes[f"{kind} ok"] += 1
        self.report.audio_seconds += frames / 12.5
        if output == "AUDIO" and kind != "offline" and first is not None:
            self.report.first_audio_s.append(first)

    def fail(self, kind: str, detail: str) -> None:
        self.report.failures.append(f"{kind}: {detail}")

    async def worker(self, index: int) -> None:
        rng = random.Random(self.config.seed * 100003 + index)
        while time.monotonic() < self.deadline:
            self.busy_since[index] = time.monotonic()
            try:
                await self.one(rng)
            except Exception as exc:
                # request() turns every gRPC outcome into an error string, so this is the soak's own
                # bug: shown and counted, and this worker stops rather than repeat it in a tight loop.
                say(f"{self.label}: {type(exc).__name__} escaped worker {index}, which stops:\n{traceback.format_exc()}")
                self.fail("worker", f"{index}: {type(exc).__name__}: {exc}")
                return
            finally:
                del self.busy_since[index]

    def progress(self, elapsed_s: float) -> str:
        now = time.monotonic()
        oldest = f" (oldest {now - min(self.busy_since.values()):.0f} s)" if self.busy_since else ""
        ended = sum(self.report.outcomes.values()) + len(self.report.failures)
        return (f"{self.label}: {elapsed_s:.0f} s, {ended} requests ended, {len(self.report.failures)} failed, "
                f"{len(self.busy_since)} in flight{oldest}, rss {rss_mib():.0f} MiB")

    async def watch(self, start: float, stop=None) -> None:
        """Progress every PROGRESS_S; `stop` (a multiprocessing.Event, set when another client
        process died) ends the load: no new requests, those in flight run to their end."""
        next_line = start + PROGRESS_S
        while True:
            await asyncio.sleep(STOP_POLL_S)
            now = time.monotonic()
            if stop is not None and stop.is_set() and self.deadline > now:
                self.deadline = now
                say(f"{self.label}: told to stop; {len(self.busy_since)} requests in flight run to their end")
            if now >= next_line:
                say(self.progress(now - start))
                next_line += PROGRESS_S


async def run_load(config: SoakConfig, label: str = "soak client 0", stop=None) -> SoakReport:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(config.url)
    soak = Soak(config, client, tone_wav(), label)
    start = time.monotonic()
    soak.deadline = start + config.seconds
    watcher = asyncio.create_task(soak.watch(start, stop))
    try:
        await asyncio.gather(*(soak.worker(i) for i in range(config.concurrency)))
    finally:
        watcher.cancel()
        await client.close()
    soak.report.wall_seconds = time.monotonic() - start
    return soak.report


Load = Callable[[SoakConfig, int, object], SoakReport]  # (config, client process index, stop Event or None)


def load_in_process(config: SoakConfig, index: int, stop=None) -> SoakReport:
    """One client process's load: the default Load."""
    return asyncio.run(run_load(config, f"soak client {index}", stop))

