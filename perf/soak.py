"""Soak: many concurrent streams against a running server, random cancels and bad input mixed in,
then proof that nothing is left behind.

  python perf/soak.py --url localhost:8001 --metrics-url http://localhost:8002/metrics \
      --concurrency 256 --seconds 600 --cancel-fraction 0.2 --min-frames 40 --max-frames 112 --out soak.json

Every worker runs one request after another until the time is up. A request is, by chance:
a cancel (the gRPC stream is cancelled before its first response or after 1-3 chunks), a bad
input (must end in one INVALID_ARGUMENT error, or Triton's own rejection for a wrong dtype),
or a normal request: streamed audio, STREAM=false, CODES only, a clone, a continuation, or the
moss_tts_codes ensemble. Normal requests use IGNORE_STOP, so their length is known and checked.
After the load: within `--settle` seconds no stream, engine row or vocoder session may be in
use, and every model instance's heartbeat must move (client/server_health.py). Exit 0 when
all of it holds; the JSON report says what happened (tests/test_soak.py runs a short one).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.server_health import check as heartbeats_move, fetch  # noqa: E402
from moss_tts import contract  # noqa: E402

SPF = contract.SAMPLES_PER_FRAME
BAD_INPUTS = [({"TEXT": ""}, "TEXT is empty"), ({"TOP_P": 5.0}, "top_p must be in"),
              ({"MAX_FRAMES": 0}, "max_frames must be in"), ({"MODE": "sing"}, "MODE must be one of"),
              ({"MODE": "continuation"}, "continuation needs"),
              ({"REFERENCE_AUDIO": b"RIFF not audio"}, "could not be decoded"),
              ({"TOP_K": ("FP32", 3.0)}, None)]  # a wrong dtype: Triton itself rejects it


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


class Soak:
    def __init__(self, config: SoakConfig, client, reference: bytes) -> None:
        self.config = config
        self.client = client
        self.reference = reference
        self.report = SoakReport()

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
        _, error, _ = await self.request("moss_tts", values, cancel_after=how)
        if error is None:  # finished before the cancel landed: fine, but say so
            self.report.outcomes["cancel came too late"] += 1
        elif error == "cancelled by us" or "CANCELLED" in error:
            self.report.outcomes["cancelled"] += 1
        else:
            self.fail("cancel", error)

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

    async def worker(self, index: int, deadline: float) -> None:
        rng = random.Random(self.config.seed * 100003 + index)
        while time.monotonic() < deadline:
            await self.one(rng)


async def run_load(config: SoakConfig) -> SoakReport:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(config.url)
    soak = Soak(config, client, tone_wav())
    start = time.monotonic()
    try:
        await asyncio.gather(*(soak.worker(i, start + config.seconds) for i in range(config.concurrency)))
    finally:
        await client.close()
    soak.report.wall_seconds = time.monotonic() - start
    return soak.report


def read_metrics(metrics_url: str) -> dict[str, float]:
    """Our custom series summed over model instances, e.g. {'moss_engine{stat="running"}': 0.0}."""
    return sum_instances(fetch(metrics_url, 10.0))


def sum_instances(text: str) -> dict[str, float]:
    """Prometheus text -> {series without its `model_instance` label: sum over instances} for moss_*
    series (a multi-GPU layout runs one engine and one vocoder per GPU)."""
    import re

    totals: dict[str, float] = {}
    for m in re.finditer(r"^(moss_\S+) (\S+)$", text, re.M):
        key = re.sub(r'(?<=[{,])model_instance="[^"]*",?', "", m.group(1)).replace(",}", "}").replace("{}", "")
        totals[key] = totals.get(key, 0.0) + float(m.group(2))
    return totals


IN_PROCESS_SESSIONS = 'moss_tts_vocoder{stat="active_slots"}'  # moss_tts's own vocoder (vocoder=in_process)
IN_FLIGHT = 'moss_tts_requests{stat="in_flight"}'  # moss_tts's requests without their final flag yet
DOUBLE_FINALS = 'moss_tts_requests{stat="double_finals"}'


def vocoder_sessions(m: dict[str, float]) -> float:
    """Open codec sequences: the vocoder model's (direct callers, BLS) + moss_tts's in-process ones."""
    return m.get('moss_vocoder_sessions{state="active"}', 0.0) + m.get(IN_PROCESS_SESSIONS, 0.0)


def idle_problems(m: dict[str, float], max_running: int) -> list[str]:
    """What is still in use once every client is gone (empty list = nothing)."""
    wanted = {'moss_engine{stat="streams"}': 0, 'moss_engine{stat="running"}': 0,
              'moss_engine{stat="waiting"}': 0, 'moss_engine{stat="free_slots"}': max_running,
              'moss_vocoder_sessions{state="active"}': 0}
    for name in (IN_PROCESS_SESSIONS, IN_FLIGHT, DOUBLE_FINALS):
        if name in m:  # series of the current moss_tts (older servers lack them)
            wanted[name] = 0
    return [f"{name} is {m.get(name)}, want {value}" for name, value in wanted.items() if m.get(name) != value]


def settle(metrics_url: str, max_running: int, timeout_s: float) -> tuple[dict, list[str]]:
    """Wait until nothing is in use, then check the heartbeats; -> (metrics, problems)."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = read_metrics(metrics_url)
        problems = idle_problems(metrics, max_running)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    beat = heartbeats_move(metrics_url)
    return metrics, problems + ([beat] if beat else [])


def _load_in_process(config: SoakConfig) -> SoakReport:
    return asyncio.run(run_load(config))


def merge(reports: list[SoakReport]) -> SoakReport:
    merged = SoakReport()
    for r in reports:
        merged.outcomes.update(r.outcomes)
        merged.failures += r.failures
        merged.first_audio_s += r.first_audio_s
        merged.audio_seconds += r.audio_seconds
        merged.wall_seconds = max(merged.wall_seconds, r.wall_seconds)
    return merged


def soak(config: SoakConfig, metrics_url: str, max_running: int, settle_s: float = 30.0,
         processes: int = 1) -> SoakReport:
    """The load (in `processes` client processes, concurrency split between them, so one Python
    process is not what limits hundreds of streams), then the end checks."""
    if processes <= 1:
        report = _load_in_process(config)
    else:
        from concurrent.futures import ProcessPoolExecutor
        from dataclasses import replace

        shares = [config.concurrency // processes + (i < config.concurrency % processes) for i in range(processes)]
        configs = [replace(config, concurrency=n, seed=config.seed * 1000 + i) for i, n in enumerate(shares) if n]
        with ProcessPoolExecutor(len(configs)) as pool:
            report = merge(list(pool.map(_load_in_process, configs)))
    metrics, report.end_problems = settle(metrics_url, max_running, settle_s)
    report.end_state = {k: v for k, v in metrics.items()
                        if "engine" in k or "vocoder" in k or "heartbeat" in k or k.startswith("moss_tts_requests{")}
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="localhost:8001")
    p.add_argument("--metrics-url", default="http://localhost:8002/metrics")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--cancel-fraction", type=float, default=0.2)
    p.add_argument("--bad-fraction", type=float, default=0.1)
    p.add_argument("--min-frames", type=int, default=6)
    p.add_argument("--max-frames", type=int, default=30)
    p.add_argument("--max-running", type=int, default=256, help="moss_tts max_running_requests summed over its instances (free slots when idle; 512 on replicas_2gpu)")
    p.add_argument("--settle", type=float, default=30.0)
    p.add_argument("--processes", type=int, default=1, help="client processes sharing the concurrency")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    config = SoakConfig(args.url, args.concurrency, args.seconds, args.cancel_fraction, args.bad_fraction,
                        args.min_frames, args.max_frames)
    report = soak(config, args.metrics_url, args.max_running, args.settle, args.processes)
    summary = {"config": asdict(config), **report.summary()}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
