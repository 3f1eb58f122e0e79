"""Where a device machine's CPU goes while a load runs (issue 34): the whole machine, and each
process group, in cores.

    python3 perf/cpu_sample.py --interval 5 > cpu_series.txt        # until killed
    python3 perf/cpu_sample.py --summary cpu_series.txt [--skip 40]  # mean over the samples

Every interval one JSON line: `t`, the machine's `busy` / `steal` / `iowait` cores (from /proc/stat:
steal is time a VM's vCPU was runnable and the host ran something else) and `groups`, the cores
used by each group of processes (utime + stime from /proc/PID/stat): `tritonserver`, each Python
backend stub by its model (`moss_tts`, `vocoder`, `ref_encoder`, ...), `clients` (the bench's and
the soak's Python processes, by their command line) and `other`. Round 10 served the same code on
three machines, and the engine thread's host time a step under the soak was 4.1 ms on one and
16.7-27 ms on the others: this says whether such a machine is short of cores, stolen from, or
neither (then the time is the stub's GIL: perf/host_probe.py). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
STUB_MODEL = re.compile(r"repo/([A-Za-z0-9_]+)/1/model\.py")
CLIENT = re.compile(r"perf[./](soak|bench_triton|shim_load)|multiprocessing|tritonclient")


def machine_ticks() -> dict[str, int]:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return {"busy": user + nice + system + irq + softirq, "idle": idle, "iowait": iowait, "steal": steal}


def group_of(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
    if "triton_python_backend_stub" in cmd:
        m = STUB_MODEL.search(cmd)
        return m.group(1) if m else "stub"
    if "tritonserver" in cmd.split(" ", 1)[0]:
        return "tritonserver"
    return "clients" if CLIENT.search(cmd) else "other"


def process_ticks() -> dict[str, int]:
    """pid -> utime + stime, for every process now."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            out[pid] = int(rest[11]) + int(rest[12])
        except (OSError, IndexError, ValueError):
            continue
    return out


def sample(interval: float) -> None:
    names: dict[str, str] = {}
    last_m, last_p, last_t = machine_ticks(), process_ticks(), time.monotonic()
    while True:
        time.sleep(interval)
        m, p, now = machine_ticks(), process_ticks(), time.monotonic()
        dt = now - last_t
        groups: dict[str, float] = {}
        for pid, ticks in p.items():
            if pid not in names:
                names[pid] = group_of(pid)
            used = ticks - last_p.get(pid, 0)  # a process born this interval: all its ticks
            if used > 0 and names[pid]:
                groups[names[pid]] = groups.get(names[pid], 0.0) + used / TICK / dt
        line = {"t": round(time.time(), 2)}
        line.update({k: round((m[k] - last_m[k]) / TICK / dt, 2) for k in ("busy", "steal", "iowait")})
        line["groups"] = {k: round(v, 2) for k, v in sorted(groups.items())}
        print(json.dumps(line), flush=True)
        last_m, last_p, last_t = m, p, now


def summary(path: str, skip: float) -> dict:
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    if rows:
        rows = [r for r in rows if r["t"] - rows[0]["t"] >= skip] or rows
    n = len(rows) or 1
    out = {"samples": len(rows)}
    for k in ("busy", "steal", "iowait"):
        out[k] = round(sum(r[k] for r in rows) / n, 2)
    groups: dict[str, float] = {}
    for r in rows:
        for g, v in r["groups"].items():
            groups[g] = groups.get(g, 0.0) + v / n
    out["groups"] = {g: round(v, 2) for g, v in sorted(groups.items(), key=lambda kv: -kv[1])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--summary", default="", help="a series this wrote: print its means")
    ap.add_argument("--skip", type=float, default=0.0, help="with --summary: seconds from the first sample to leave out")
    args = ap.parse_args()
    if args.summary:
        print(json.dumps(summary(args.summary, args.skip)))
        return
    try:
        sample(args.interval)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
