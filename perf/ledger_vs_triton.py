"""moss_tts's request ledger beside Triton's own counters, request kind by kind (issue 20).

  python -m perf.ledger_vs_triton --url localhost:8001 --metrics-url http://localhost:8002/metrics

Against a running server with nothing else on it: two requests of each kind (streamed,
STREAM=false, codes only, refused by the model, wrong dtype, cancelled before the first response,
cancelled after one chunk, the moss_tts_codes ensemble, the ensemble cancelled after one chunk),
one after another; after each pair, how the ledger (`moss_tts_requests`) and Triton's
`nv_inference_*` series for moss_tts moved. Then one long stream, read mid-way: Triton counts a
decoupled request as a success when execute() returns, the ledger counts it in flight until its
final response (docs/structure.md, "Shutdown after a cancel-heavy soak").
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import urllib.request

from perf.soak_load import Soak, SoakConfig, tone_wav
from perf.soak_metrics import read_metrics

TRITON = ("request_success", "request_failure", "pending_request_count")


def triton_counts(metrics_url: str, model: str = "moss_tts") -> dict[str, float]:
    """nv_inference_{request_success,request_failure{reason},pending_request_count} of one model."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode("utf-8", "replace")
    counts: dict[str, float] = {}
    for m in re.finditer(r"^nv_inference_(\w+)\{([^}]*)\} (\S+)$", text, re.M):
        if m.group(1) in TRITON and f'model="{model}"' in m.group(2):
            reason = re.search(r'reason="(\w+)"', m.group(2))
            key = f"{m.group(1)}{{{reason.group(1)}}}" if reason else m.group(1)
            counts[key] = counts.get(key, 0.0) + float(m.group(3))
    return counts


def ledger(metrics_url: str) -> dict[str, float]:
    """The ledger once two reads 0.6 s apart agree (its gauge is published every 0.5 s)."""
    previous = None
    for _ in range(20):
        values = {k.split('"')[1]: v for k, v in read_metrics(metrics_url).items() if k.startswith("moss_tts_requests{")}
        if values == previous:
            return values
        previous = values
        time.sleep(0.6)
    return previous


def line(metrics_url: str) -> str:
    led, tri = ledger(metrics_url), triton_counts(metrics_url)
    return (f"ledger entered={led.get('entered', 0):g} finals={led.get('finals', 0):g} in_flight={led.get('in_flight', 0):g} | "
            "triton " + " ".join(f"{k}={v:g}" for k, v in sorted(tri.items()) if v or "failure" not in k))


async def run(url: str, metrics_url: str) -> None:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    soak = Soak(SoakConfig(url, 1, 1.0, response_timeout_s=60.0), client, tone_wav())
    base = {"TEXT": "Hello there.", "MAX_FRAMES": 8, "IGNORE_STOP": True, "SEED": 1}
    long = dict(base, MAX_FRAMES=96, FIRST_CHUNK_FRAMES=2, CHUNK_FRAMES=4)
    ensemble = {"REFERENCE_AUDIO": b""}
    kinds = [  # (what, model, inputs, outputs, cancel_after, ensemble)
        ("streamed", "moss_tts", base, ["AUDIO"], None, False),
        ("STREAM=false", "moss_tts", dict(base, STREAM=False), ["AUDIO"], None, False),
        ("codes only", "moss_tts", base, ["CODES"], None, False),
        ("refused by the model (empty TEXT)", "moss_tts", dict(base, TEXT=""), None, None, False),
        ("wrong dtype (Triton refuses)", "moss_tts", dict(base, TOP_K=("FP32", 3.0)), None, None, False),
        ("cancelled before the first response", "moss_tts", long, ["AUDIO"], ("delay", 0.03), False),
        ("cancelled after one chunk", "moss_tts", long, ["AUDIO"], ("chunks", 1), False),
        ("ensemble", "moss_tts_codes", dict(base, **ensemble), ["CODES"], None, True),
        ("ensemble cancelled after one chunk", "moss_tts_codes", dict(long, **ensemble), ["CODES"], ("chunks", 1), True),
    ]
    print(f"{'start':40s} {line(metrics_url)}")
    try:
        for what, model, values, outputs, cancel, is_ensemble in kinds:
            outcomes = []
            for _ in range(2):
                responses, error, _ = await soak.request(model, values, outputs, cancel_after=cancel, ensemble=is_ensemble)
                outcomes.append(f"{len(responses)} responses, {(error or 'final')[:50]}")
            print(f"{'2x ' + what:40s} {line(metrics_url)}   ({'; '.join(outcomes)})")
        stream = asyncio.create_task(soak.request("moss_tts", dict(long, MAX_FRAMES=1500), ["AUDIO"]))
        await asyncio.sleep(1.0)  # mid-stream: no settling, the gauge is at most 0.5 s old
        led, tri = ledger(metrics_url), triton_counts(metrics_url)
        print(f"{'one long stream, mid-way':40s} ledger in_flight={led.get('in_flight', 0):g} | "
              f"triton request_success={tri['request_success']:g} pending={tri['pending_request_count']:g}")
        responses, error, _ = await stream
        print(f"{'  ... ended':40s} {line(metrics_url)}   ({len(responses)} responses, {error or 'final'})")
    finally:
        await client.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="localhost:8001")
    p.add_argument("--metrics-url", default="http://localhost:8002/metrics")
    args = p.parse_args(argv)
    asyncio.run(run(args.url, args.metrics_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
