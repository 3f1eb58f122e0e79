"""The GPU budget per frame under load, from the server's own counters (issue 34).

    python3 perf/served_budget.py metrics_series_single.txt [more series ...] [--rows 200-300] [--out budget.json]

Reads the series perf/h200_scaling.sh samples every 0.5 s while the bench levels run
(`metrics_series_NAME.txt`, plain or .gz: a "t <unix time>" line, then one "moss_engine <stat>
<value>" / "moss_tts_vocoder <stat> <value>" line per counter). It sums the counters' increments
over the sample intervals whose both ends had a number of running engine rows inside `--rows`
(the 256-stream level: 200-300), and reports:
  engine   steps, host ms and device-wait ms per step (step_host_ms, step_wait_ms), rows per step,
           and the engine's wall time per frame ((host + wait) / frames generated);
  vocoder  rounds, frames per round, ms per round, µs per frame (round_ms / frames: wall time of
           a round, the GPU shared with the engine) and busy (round_ms over the window's time).
Rounds run beside steps, so the two per-frame figures overlap: their sum is not the GPU's time.

With --cpu CPU_SERIES (perf/cpu_sample.py's series of the same run, one per series, in order)
the run is also cut into 10 s windows and the windows grouped by the CPU that the machine's
hypervisor took from its vCPUs meanwhile (steal, in cores: under 0.05, up to 0.3, 0.3 and more):
host and device-wait ms a step, engine and vocoder frames/s per group. Round 11 found the stub's
host time a step rising ~11 ms and the frames/s falling ~20% in windows with ~0.9 cores stolen,
the same machine and code: a figure from stolen windows is not one from the code alone.

With --timeline every sample interval is printed instead (all rows): running and waiting
requests, requests admitted, engine and vocoder frames/s, and per step the host ms split into
launch, apply and the rest (scheduling, staging admitted prompts) beside the device wait: where
an admission burst's host time goes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ENGINE = ("steps", "step_host_ms", "step_wait_ms", "frames_generated")
VOCODER = ("rounds", "frames", "round_ms")


def read_series(path: Path) -> list[dict[str, float]]:
    """One dict per sample: 't' and 'engine.<stat>' / 'vocoder.<stat>' for the counters sampled.
    The sampler drops the model_instance label, so a layout with an engine per GPU writes a stat
    once per instance: those lines are summed, as soak_metrics.sum_instances sums them."""
    opener = gzip.open if path.suffix == ".gz" else open
    samples: list[dict[str, float]] = []
    with opener(path, "rt") as lines:
        for line in lines:
            fields = line.split()
            if len(fields) == 2 and fields[0] == "t":
                samples.append({"t": float(fields[1])})
            elif len(fields) == 3 and samples and fields[0] in ("moss_engine", "moss_tts_vocoder"):
                stage = "engine" if fields[0] == "moss_engine" else "vocoder"
                try:
                    value = float(fields[2])
                except ValueError:
                    continue
                key = f"{stage}.{fields[1]}"
                samples[-1][key] = samples[-1].get(key, 0.0) + value
    return samples


def budget(samples: list[dict[str, float]], rows: tuple[int, int]) -> dict:
    """The counters' increments over the intervals with rows[0] <= running <= rows[1] at both ends.
    An interval where a counter is missing at either end (a sample cut short) is left out whole."""
    lo, hi = rows
    sums = {key: 0.0 for key in ("seconds", *(f"engine.{k}" for k in ENGINE), *(f"vocoder.{k}" for k in VOCODER))}
    intervals = 0
    for a, b in zip(samples, samples[1:]):
        if not all(lo <= s.get("engine.running", -1) <= hi for s in (a, b)):
            continue
        if any(key not in a or key not in b for key in sums if key != "seconds"):
            continue
        intervals += 1
        sums["seconds"] += b["t"] - a["t"]
        for key in sums:
            if key != "seconds":
                sums[key] += b.get(key, 0.0) - a.get(key, 0.0)
    steps, frames, rounds = sums["engine.steps"], sums["engine.frames_generated"], sums["vocoder.rounds"]
    host, wait = sums["engine.step_host_ms"], sums["engine.step_wait_ms"]
    out = {"rows": list(rows), "intervals": intervals, "seconds": sums["seconds"], "steps": steps,
           "rounds": rounds, "frames_generated": frames, "frames_decoded": sums["vocoder.frames"]}
    if steps and frames:
        out.update(host_ms_per_step=host / steps, wait_ms_per_step=wait / steps, rows_per_step=frames / steps,
                   engine_us_per_frame=(host + wait) * 1e3 / frames)
    if rounds and sums["vocoder.frames"]:
        out.update(frames_per_round=sums["vocoder.frames"] / rounds, ms_per_round=sums["vocoder.round_ms"] / rounds,
                   vocoder_us_per_frame=sums["vocoder.round_ms"] * 1e3 / sums["vocoder.frames"],
                   vocoder_busy=sums["vocoder.round_ms"] / 1e3 / sums["seconds"] if sums["seconds"] else None)
    return out


TIMELINE = ("steps", "step_host_ms", "step_launch_ms", "step_apply_ms", "step_wait_ms", "frames_generated",
            "requests_admitted")


def timeline(samples: list[dict[str, float]]) -> list[dict]:
    """Per sample interval with engine steps or vocoder rounds: the counters' rates and per-step means."""
    rows = []
    t0 = samples[0]["t"] if samples else 0.0
    for a, b in zip(samples, samples[1:]):
        dt = b["t"] - a["t"]
        inc = {k: b.get(f"engine.{k}", 0.0) - a.get(f"engine.{k}", 0.0) for k in TIMELINE}
        rounds = b.get("vocoder.rounds", 0.0) - a.get("vocoder.rounds", 0.0)
        decoded = b.get("vocoder.frames", 0.0) - a.get("vocoder.frames", 0.0)
        if dt <= 0 or not (inc["steps"] or rounds):
            continue
        steps = max(inc["steps"], 1.0)
        host, launch, apply = inc["step_host_ms"] / steps, inc["step_launch_ms"] / steps, inc["step_apply_ms"] / steps
        rows.append({"t": round(b["t"] - t0, 2), "dt": round(dt, 3), "running": b.get("engine.running", 0.0),
                     "waiting": b.get("engine.waiting", 0.0), "admitted": inc["requests_admitted"],
                     "engine_fps": inc["frames_generated"] / dt, "vocoder_fps": decoded / dt, "steps": inc["steps"],
                     "host_ms": host, "launch_ms": launch, "apply_ms": apply, "rest_ms": host - launch - apply,
                     "wait_ms": inc["step_wait_ms"] / steps, "rounds": rounds,
                     "frames_per_round": decoded / rounds if rounds else 0.0})
    return rows


def timeline_text(rows: list[dict]) -> str:
    lines = ["     t    dt  run wait adm eng_fps voc_fps steps  host launch apply  rest  wait rounds fr/round"]
    for r in rows:
        lines.append(f"{r['t']:6.2f} {r['dt']:5.2f} {r['running']:4.0f} {r['waiting']:4.0f} {r['admitted']:3.0f} "
                     f"{r['engine_fps']:7.0f} {r['vocoder_fps']:7.0f} {r['steps']:5.0f} {r['host_ms']:5.1f} "
                     f"{r['launch_ms']:6.1f} {r['apply_ms']:5.1f} {r['rest_ms']:5.1f} {r['wait_ms']:5.1f} "
                     f"{r['rounds']:6.0f} {r['frames_per_round']:8.0f}")
    return "\n".join(lines)


STEAL_BANDS = ((0.0, 0.05), (0.05, 0.3), (0.3, float("inf")))


def read_cpu(path: Path) -> list[dict]:
    """perf/cpu_sample.py's series: one dict per sample (t, busy, steal, iowait, groups)."""
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.startswith("{")]


def steal_bands(samples: list[dict[str, float]], cpu: list[dict], window_s: float = 10.0,
                skip_s: float = 20.0) -> list[dict]:
    """The engine's and the vocoder's rates per group of `window_s` windows (from `skip_s` after the
    first engine sample to the last), each window in the STEAL_BANDS band of the mean steal of the
    CPU samples that ended inside it; windows without two engine samples or a CPU sample are left out."""
    engine = [s for s in samples if "engine.steps" in s]
    if not engine:
        return []
    windows, start = [], engine[0]["t"] + skip_s
    while start + window_s <= engine[-1]["t"]:
        inside = [s for s in engine if start <= s["t"] < start + window_s]
        steal = [c["steal"] for c in cpu if start < c["t"] <= start + window_s]
        if len(inside) >= 2 and steal:
            a, b = inside[0], inside[-1]
            inc = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in ("engine.steps", "engine.step_host_ms",
                                                              "engine.step_wait_ms", "engine.frames_generated",
                                                              "vocoder.frames")}
            windows.append((sum(steal) / len(steal), b["t"] - a["t"], inc))
        start += window_s
    out = []
    for lo, hi in STEAL_BANDS:
        band = [w for w in windows if lo <= w[0] < hi]
        if not band:
            continue
        seconds = sum(w[1] for w in band)
        total = {k: sum(w[2][k] for w in band) for k in band[0][2]}
        steps = total["engine.steps"] or 1.0
        out.append({"steal_band": [lo, hi], "windows": len(band), "seconds": seconds,
                    "steal_cores": sum(w[0] for w in band) / len(band),
                    "host_ms_per_step": total["engine.step_host_ms"] / steps,
                    "wait_ms_per_step": total["engine.step_wait_ms"] / steps,
                    "engine_fps": total["engine.frames_generated"] / seconds,
                    "vocoder_fps": total["vocoder.frames"] / seconds})
    return out


def steal_text(name: str, bands: list[dict]) -> str:
    lines = [f"{name}: by the cores stolen from the machine (10 s windows)",
             "| steal band (cores) | windows | steal | host ms / step | device wait ms / step | engine frames/s "
             "| vocoder frames/s |", "|---|---|---|---|---|---|---|"]
    for b in bands:
        lo, hi = b["steal_band"]
        lines.append(f"| {f'{lo:g}-{hi:g}' if hi != float('inf') else f'>= {lo:g}'} | {b['windows']} | {b['steal_cores']:.2f} | {b['host_ms_per_step']:.1f} | "
                     f"{b['wait_ms_per_step']:.1f} | {b['engine_fps']:.0f} | {b['vocoder_fps']:.0f} |")
    return "\n".join(lines)


def markdown(results: dict[str, dict]) -> str:
    lines = ["| series | seconds | host ms / step | device wait ms / step | rows / step | vocoder frames / round "
             "| ms / round | vocoder µs / frame | vocoder busy |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "host_ms_per_step" not in r or "frames_per_round" not in r:
            lines.append(f"| {name} | {r['seconds']:.1f} | no steps and rounds in rows {r['rows']} |||||||")
            continue
        busy = f"{r['vocoder_busy']:.0%}" if r.get("vocoder_busy") is not None else "-"
        lines.append(f"| {name} | {r['seconds']:.1f} | {r['host_ms_per_step']:.2f} | {r['wait_ms_per_step']:.2f} | "
                     f"{r['rows_per_step']:.0f} | {r['frames_per_round']:.0f} | {r['ms_per_round']:.1f} | "
                     f"{r['vocoder_us_per_frame']:.0f} | {busy} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("series", nargs="+", type=Path, help="metrics_series_*.txt files (or .gz)")
    ap.add_argument("--rows", default="200-300", help="LO-HI: running engine rows at both ends of an interval")
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write the results to")
    ap.add_argument("--timeline", action="store_true", help="print every sample interval instead")
    ap.add_argument("--cpu", type=Path, nargs="*", default=[],
                    help="perf/cpu_sample.py series of the same runs, one per series: the rates by steal band too")
    args = ap.parse_args(argv)
    if args.cpu and len(args.cpu) != len(args.series):
        ap.error(f"--cpu: {len(args.cpu)} CPU series for {len(args.series)} metric series")
    if args.timeline:
        for path in args.series:
            print(f"== {path}\n{timeline_text(timeline(read_series(path)))}")
        return 0
    lo, _, hi = args.rows.partition("-")
    rows = (int(lo), int(hi or lo))
    if rows[0] > rows[1]:
        ap.error(f"--rows {args.rows}: LO must not exceed HI")
    series = {path: read_series(path) for path in args.series}
    results = {str(path): budget(samples, rows) for path, samples in series.items()}
    for path, cpu in zip(args.series, args.cpu):
        results[str(path)]["steal_bands"] = bands = steal_bands(series[path], read_cpu(cpu))
        print(steal_text(str(path), bands))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    print(markdown(results))
    return 0 if any(r["intervals"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
