"""The served GPU budget from a trace of the `moss_tts` stub (serving/gpu_trace.py; issue 34).

    python3 perf/gpu_trace_budget.py trace-0.json.gz [--out budget.json]

From a Chrome trace's GPU events (kernels, memcpys, memsets), over the traced window (first GPU
event's start to the last one's end):
- per CUDA stream: what it is (by its kernels: the engine's decode step, the codec's rounds,
  other), events, busy ms (the union of its events) and the share of the window;
- the GPU: busy (any stream), idle, and the time two or more streams were busy together;
- the engine's stream: its decode steps (one `_decode_qkv_kernel` per backbone layer a step;
  `_draw_kernel` runs 13 times a step, the stop and 12 codebooks, and once more per prefill),
  ms a step, and its idle gaps (the host's time between launches, or waits on another stream);
- per stream, the kernels that took the most time;
- the engine's prefill launches: one prefill attention kernel per backbone layer a launch (PyTorch's
  `fmha_*` / flash kernels, or the engine's `_prefill_kernel`): launches, their span and kernel time,
  their share of the stream, and their kernels by time (round 13: ~40% of the soak's engine stream).
No torch import: it runs wherever the trace is.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Kernels that name a stream's work: the engine's decode step (attention split and combine, the
# fused qkv, the draw) and the codec's round (window attention, its ring write, its norms).
ENGINE_MARKERS = ("_split_kernel", "_combine_kernel", "_decode_qkv_kernel", "_draw_kernel", "_local_attention_kernel")
CODEC_MARKERS = ("_ring_write_kernel", "_attention_kernel", "_rope_kernel", "_layer_norm_kernel")
STEP_MARKER = "_decode_qkv_kernel"  # once per backbone layer per decode step (engine/backbone.py)
BACKBONE_LAYERS = 36  # Qwen3-4B's


def is_prefill_attention(name: str) -> bool:
    """A prefill's attention kernel: SDPA's (memory-efficient `fmha_cutlassF*`, flash) or the engine's own."""
    return name == "_prefill_kernel" or name.startswith("fmha_") or "flash_fwd" in name


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES and "dur" in e]


def merged(intervals: list[tuple[float, float]]) -> list[list[float]]:
    """The union of [start, end) intervals as disjoint [start, end] runs, in order."""
    runs: list[list[float]] = []
    for s, e in sorted(intervals):
        if runs and s <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], e)
        else:
            runs.append([s, e])
    return runs


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs in), in ms."""
    return sum(e - s for s, e in merged(intervals)) / 1e3


def overlap_ms(per_stream: dict[object, list[tuple[float, float]]]) -> float:
    """Time at least two streams were busy at once, in ms (a sweep over each stream's union)."""
    edges = sorted((t, d) for intervals in per_stream.values() for s, e in merged(intervals)
                   for t, d in ((s, 1), (e, -1)))
    busy, last, total = 0, None, 0.0
    for t, d in edges:
        if busy >= 2 and last is not None:
            total += t - last
        busy += d
        last = t
    return total / 1e3


def label(names: set[str]) -> str:
    # Whole names: the engine's _local_attention_kernel ends like the codec's _attention_kernel.
    engine, codec = bool(names & set(ENGINE_MARKERS)), bool(names & set(CODEC_MARKERS))
    return "engine+codec" if engine and codec else "engine" if engine else "codec" if codec else "other"


def gaps_ms(intervals: list[tuple[float, float]]) -> list[float]:
    """The idle gaps between a stream's busy runs, in ms."""
    runs = merged(intervals)
    return [(b[0] - a[1]) / 1e3 for a, b in zip(runs, runs[1:])]


def budget(events: list[dict], top: int = 10, layers: int = BACKBONE_LAYERS) -> dict:
    if not events:
        return {"events": 0, "problem": "no GPU events in the trace (was CUPTI's kernel activity recorded?)"}
    start = min(e["ts"] for e in events)
    window_ms = (max(e["ts"] + e["dur"] for e in events) - start) / 1e3
    streams: dict[object, list[dict]] = defaultdict(list)
    for e in events:
        streams[e.get("args", {}).get("stream", "?")].append(e)
    per_stream = {s: [(e["ts"], e["ts"] + e["dur"]) for e in evs] for s, evs in streams.items()}
    out = {"window_ms": round(window_ms, 2), "events": len(events),
           "gpu_busy_ms": round(union_ms([i for v in per_stream.values() for i in v]), 2),
           "two_or_more_streams_ms": round(overlap_ms(per_stream), 2), "streams": []}
    out["gpu_idle_ms"] = round(window_ms - out["gpu_busy_ms"], 2)
    out["gpu_busy_share"] = round(out["gpu_busy_ms"] / window_ms, 4) if window_ms else 0.0
    for stream, evs in sorted(streams.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        names = {e["name"] for e in evs}
        by_name: dict[str, list[float]] = defaultdict(list)
        for e in evs:
            by_name[e["name"]].append(e["dur"])
        busy = union_ms(per_stream[stream])
        row = {"stream": stream, "label": label(names), "events": len(evs), "busy_ms": round(busy, 2),
               "busy_share": round(busy / window_ms, 4) if window_ms else 0.0,
               "top": [{"name": n[:90], "calls": len(d), "ms": round(sum(d) / 1e3, 3),
                        "us_per_call": round(statistics.fmean(d), 2)}
                       for n, d in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]]}
        steps = len(by_name.get(STEP_MARKER, [])) / layers
        if steps and window_ms:
            row.update(decode_steps=round(steps, 2), steps_per_s=round(steps / window_ms * 1e3, 1),
                       ms_per_step=round(window_ms / steps, 2), busy_ms_per_step=round(busy / steps, 2))
        prefill = prefill_launches(evs, layers, window_ms, busy, top)
        if prefill:
            row["prefill"] = prefill
        gaps = gaps_ms(per_stream[stream])
        if gaps:
            q = statistics.quantiles(gaps, n=10) if len(gaps) > 1 else [gaps[0]] * 9
            long = [g for g in gaps if g > 1.0]  # the host's turns or waits, not a launch's gap
            row["gaps"] = {"count": len(gaps), "total_ms": round(sum(gaps), 2),
                           "p50_ms": round(statistics.median(gaps), 3), "p90_ms": round(q[8], 3),
                           "max_ms": round(max(gaps), 3), "over_1ms": len(long), "over_1ms_total": round(sum(long), 2)}
        out["streams"].append(row)
    return out


def prefill_launches(evs: list[dict], layers: int, window_ms: float, busy_ms: float, top: int) -> dict:
    """One stream's prefill launches: runs of `layers` prefill attention kernels in time order (a
    partial run at the window's edge is left out). A launch spans its first attention kernel's start
    to its last one's end; its kernels are the stream's that start inside the span."""
    evs = sorted(evs, key=lambda e: e["ts"])
    marks = [i for i, e in enumerate(evs) if is_prefill_attention(e["name"])]
    launches = [marks[k:k + layers] for k in range(0, len(marks) - layers + 1, layers)]
    if not launches:
        return {}
    spans, kernel_ms, by_name = [], [], defaultdict(float)
    for run in launches:
        first, last = evs[run[0]], evs[run[-1]]
        end = last["ts"] + last["dur"]
        inside = [e for e in evs[run[0]:run[-1] + 1] if e["ts"] < end]
        spans.append((end - first["ts"]) / 1e3)
        kernel_ms.append(sum(e["dur"] for e in inside) / 1e3)
        for e in inside:
            by_name[e["name"][:90]] += e["dur"] / 1e3
    total = sum(kernel_ms)
    return {"launches": len(launches), "per_s": round(len(launches) / window_ms * 1e3, 1) if window_ms else 0.0,
            "span_ms_p50": round(statistics.median(spans), 3), "kernel_ms_p50": round(statistics.median(kernel_ms), 3),
            "kernel_ms": round(total, 2), "share_of_busy": round(total / busy_ms, 4) if busy_ms else 0.0,
            "top": [{"name": n, "ms": round(t, 3)} for n, t in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]]}


def table(result: dict) -> str:
    if not result.get("events"):
        return result.get("problem", "no events")
    lines = [f"window {result['window_ms']} ms, {result['events']} GPU events: busy {result['gpu_busy_ms']} ms "
             f"({result['gpu_busy_share']:.1%}), idle {result['gpu_idle_ms']} ms, two or more streams at once "
             f"{result['two_or_more_streams_ms']} ms",
             "| stream | what | events | busy ms | share | steps | ms / step | busy ms / step | gaps > 1 ms (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in result["streams"]:
        g = s.get("gaps", {})
        lines.append(f"| {s['stream']} | {s['label']} | {s['events']} | {s['busy_ms']} | {s['busy_share']:.1%} | "
                     f"{s.get('decode_steps', '')} | {s.get('ms_per_step', '')} | {s.get('busy_ms_per_step', '')} | "
                     f"{g.get('over_1ms', 0)} ({g.get('over_1ms_total', 0)}) |")
    for s in result["streams"][:3]:
        lines.append(f"top kernels, stream {s['stream']} ({s['label']}):")
        lines += [f"  {k['ms']:9.3f} ms {k['calls']:6d} x {k['us_per_call']:8.2f} us  {k['name']}" for k in s["top"]]
        if "prefill" in s:
            p = s["prefill"]
            lines.append(f"prefill launches, stream {s['stream']}: {p['launches']} ({p['per_s']} a second), span p50 "
                         f"{p['span_ms_p50']} ms, kernels p50 {p['kernel_ms_p50']} ms, {p['kernel_ms']} ms in all "
                         f"({p['share_of_busy']:.1%} of the stream's busy time); their kernels:")
            lines += [f"  {k['ms']:9.3f} ms  {k['name']}" for k in p["top"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--layers", type=int, default=BACKBONE_LAYERS, help="backbone layers (a tiny checkpoint's differ)")
    args = ap.parse_args(argv)
    result = budget(load_events(args.trace), args.top, args.layers)
    result["trace"] = args.trace.name
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0 if result.get("events") else 1


if __name__ == "__main__":
    sys.exit(main())
