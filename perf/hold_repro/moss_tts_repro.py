"""The hold of repro.py against the project's own server: model_repository/ on the tiny checkpoint,
started as the tests start it (tests/triton_server.py), one scenario per server, then SIGTERM and
"successfully unloaded 'moss_tts'" or not (README.md).

    .venv/bin/python -m perf.hold_repro.moss_tts_repro \
        --scenarios rejected_cancel,rejected_drain --runs 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from moss_tts.contract.tensors import SAMPLES_PER_FRAME
from perf.hold_repro.repro import unload_report
from perf.soak_load import make_inputs

FRAMES = 6
SHORT = {"TEXT": "Hold repro.", "MAX_FRAMES": FRAMES, "IGNORE_STOP": True, "FIRST_CHUNK_FRAMES": 2,
         "CHUNK_FRAMES": 4}
REJECTED = {"TEXT": "Hold repro.", "TOP_K": ("FP32", 3.0)}  # a wrong dtype: Triton refuses it, not moss_tts

# name: (inputs, how the client ends the stream, streams per run, concurrent)
SCENARIOS = {
    "rejected_cancel": (REJECTED, "cancel", 1, 1),  # refused, then the stream is cancelled
    "rejected_drain": (REJECTED, "drain", 1, 1),  # refused, then half-close and read to the OK
    "last_chunk_cancel": (SHORT, "cancel_on_last_chunk", 60, 4),  # all the audio, cancel before the final
    "last_chunk_drain": (SHORT, "drain", 60, 4),
    "end_close": (SHORT, "return", 12, 12),  # perf/soak.py's end: return at the final, close the channel
    "end_drain": (SHORT, "drain", 12, 12),  # perf/soak.py now: every stream read to its end first
}


async def one_stream(client, values: dict, end: str, seed: int) -> str:
    closed = asyncio.Event()
    request = {"model_name": "moss_tts", "inputs": make_inputs(dict(values, SEED=seed)),
               "parameters": {"triton_enable_empty_final_response": True}}

    async def requests():
        yield request
        await closed.wait()

    call = client.stream_infer(requests())
    frames = 0
    try:
        while True:
            result, error = await call.__anext__()
            if error is not None:
                break
            audio = result.as_numpy("AUDIO")
            frames += 0 if audio is None else audio.shape[1] // SAMPLES_PER_FRAME
            if end == "cancel_on_last_chunk" and frames == values["MAX_FRAMES"]:
                break
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        if end.startswith("cancel"):
            call.cancel()
            return "cancelled"
        if end == "drain":
            closed.set()
            async for _ in call:
                pass
        return "error" if error is not None else "final"
    finally:
        closed.set()


async def drive(url: str, scenario: str, seed: int) -> dict:
    import tritonclient.grpc.aio as grpcclient

    values, end, streams, concurrency = SCENARIOS[scenario]
    client = grpcclient.InferenceServerClient(url)
    outcomes: dict[str, int] = {}

    async def worker(index: int) -> None:
        for i in range(streams // concurrency):
            seen = await one_stream(client, values, end, seed * 1000 + index * 100 + i)
            outcomes[seen] = outcomes.get(seen, 0) + 1

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    await client.close()  # cancels any call still open
    return outcomes


def one_run(scenario: str, run: int, tiny: Path, out: Path) -> dict:
    from tests.triton_server import start_server, stop_server

    log_path = out / f"{scenario}-{run}.log"
    server = start_server(tiny / "model", tiny / "codec", log_path, args=("--exit-timeout-secs=8",))
    try:
        outcomes = asyncio.run(drive(server.grpc_url, scenario, run))
        time.sleep(1.0)
    finally:
        exit_s = stop_server(server)
    report = {"scenario": scenario, "run": run, "outcomes": outcomes, "exit_s": round(exit_s, 1),
              **unload_report(log_path.read_text(errors="replace"), ["moss_tts"])}
    print(json.dumps(report), flush=True)
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", type=lambda s: s.split(","), default=list(SCENARIOS))
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--tiny", type=Path, default=Path(tempfile.gettempdir()) / "hold_repro_tiny")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "hold_repro_moss")
    args = p.parse_args()
    if not (args.tiny / "model").exists():
        from moss_tts.tools.make_tiny_checkpoint import main as make_tiny

        make_tiny([str(args.tiny), "--seed", "0"])
    args.out.mkdir(parents=True, exist_ok=True)
    reports = [one_run(s, run, args.tiny, args.out) for s in args.scenarios for run in range(args.runs)]
    held = {s: sum("moss_tts" in r["held"] for r in reports if r["scenario"] == s) for s in args.scenarios}
    print(json.dumps({"runs": args.runs, "runs_holding_moss_tts": held}))


if __name__ == "__main__":
    main()
