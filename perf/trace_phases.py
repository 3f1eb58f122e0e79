"""Where the first audio's time went inside `moss_tts`, level by level: the server's first-audio
trace (MOSS_TTS_FIRST_AUDIO_TRACE, pipeline/first_audio_trace.py) cut by the levels of
perf/shim_load.py's or perf/bench_triton.py's JSONs (their wall_start/wall_end), as p50 / p95 ms
per phase.

  python -m perf.trace_phases --trace first_audio_trace.jsonl shim_1.json shim_2.json [--out phases.json]

Phases (each from the moment before it): thread (execute -> its stream thread started it; a
session's request also waits for its turn there), queued (prompt built, in the engine's queue),
engine (admission, prefill and the first frames, to the first codes), read (the stream thread
took them), launched (waiting for a vocoder round), vocoded (the round decoded them), noticed (the stream thread saw it), sent (the
first audio response left); total = execute -> sent. A text session's level counts its first
requests only (session_index 0: the first sentence, the one the client's first audio times).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from moss_tts.pipeline.first_audio_trace import MOMENTS

PHASES = MOMENTS  # each phase ends at the trace's moment of that name
SESSION_TRANSPORTS = ("grpc_session", "ws")


def phases(ms: dict) -> dict:
    """Each phase's duration (ms) for a trace line's moments; only phases whose two ends exist."""
    out, before = {}, 0.0
    for name in PHASES:
        if name in ms:
            out[name] = ms[name] - before
            before = ms[name]
    if "sent" in ms:
        out["total"] = ms["sent"]
    return out


def level_phases(traces: list[dict], level: dict) -> dict:
    """p50 / p95 of every phase over the level's requests that sent audio."""
    transport = level.get("transport") or f"grpc_{level['mode']}"  # bench_triton's levels name a mode
    session = transport in SESSION_TRANSPORTS
    rows = [phases(t["ms"]) for t in traces
            if level["wall_start"] <= t["received"] <= level["wall_end"] and "sent" in t["ms"]
            and (t["session_index"] == 0 if session else t["session_index"] is None)]
    summary = {}
    for name in (*PHASES, "total"):
        values = [r[name] for r in rows if name in r]
        if values:
            summary[name] = {"p50": round(float(np.percentile(values, 50)), 1),
                             "p95": round(float(np.percentile(values, 95)), 1)}
    # The tail: each phase's mean over the slowest tenth by total (where a late request's time went).
    slow = sorted((r for r in rows if "total" in r), key=lambda r: r["total"])[-max(1, len(rows) // 10):]
    tail = {name: round(float(np.mean([r.get(name, 0.0) for r in slow])), 1) for name in (*PHASES, "total")} if slow else {}
    return {"transport": transport, "concurrency": level["concurrency"], "requests": len(rows),
            "phases_ms": summary, "slowest_tenth_mean_ms": tail}


def markdown(rows: list[dict], tail: bool = False) -> str:
    head = "| run | transport | streams | traced | " + " | ".join((*PHASES, "total")) + " |"
    lines = [head, "|" + "---|" * (4 + len(PHASES) + 1)]
    for r in rows:
        if tail:
            cells = [str(r["slowest_tenth_mean_ms"].get(p, "-")) for p in (*PHASES, "total")]
        else:
            cells = [f"{r['phases_ms'][p]['p50']} / {r['phases_ms'][p]['p95']}" if p in r["phases_ms"] else "-"
                     for p in (*PHASES, "total")]
        lines.append(f"| {r['run']} | {r['transport']} | {r['concurrency']} | {r['requests']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, required=True, help="the server's first-audio trace (JSON lines)")
    p.add_argument("levels", type=Path, nargs="+", help="perf/shim_load.py or perf/bench_triton.py JSONs")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    traces = [json.loads(line) for line in args.trace.read_text().splitlines() if line.strip()]
    rows = []
    for path in args.levels:
        report = json.loads(path.read_text())
        for level in report["levels"] if isinstance(report, dict) else report:  # bench_triton: a list
            if level.get("wall_start"):
                rows.append({"run": path.stem, **level_phases(traces, level)})
    print("p50 / p95 ms per phase\n" + markdown(rows))
    print("\nmean ms per phase over the slowest tenth of each level\n" + markdown(rows, tail=True))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
