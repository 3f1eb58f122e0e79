"""What kind of host a device machine is, in the terms the `moss_tts` stub cares about (issue 34).

    python3 perf/host_probe.py [--out host_probe.json]

Round 10 served the same code on three H200 machines and found the engine thread's host time a step
under the mixed soak 4.1 ms on one and 16.7-27 ms on the two others. The stub is one Python process
whose ~300 threads share one GIL, so what matters is how fast one core runs Python and how long a
thread that gives the GIL up (every torch call does) waits to win it back. This measures, idle:
  cpu         model name, cores visible, cores this process may use
  python_ms   one core's Python: a fixed pure-Python loop (ms, best of 5)
  event_us    a thread wakes another through threading.Event and is woken back: one round trip
              (µs, median of 5 batches of 500): the OS's wake-up latency, a VM's included
  regain_us   one thread makes a GIL-releasing call (time.sleep(0)) while N others run Python, at
              the stub's switch interval (0.05 ms): how long it waits to hold the GIL again
              (µs, median and p90), for N = 1 and 8
Writes nothing else and needs nothing but the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time


def cpu_facts() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(), "usable": len(os.sched_getaffinity(0))}


def python_ms() -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        d = {}
        for i in range(300_000):
            d[i & 1023] = d.get(i & 1023, 0) + i
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def event_us(rounds: int = 500) -> float:
    ping, pong = threading.Event(), threading.Event()
    stop = False

    def echo():
        while True:
            ping.wait()
            ping.clear()
            if stop:
                return
            pong.set()

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(rounds):
            ping.set()
            pong.wait()
            pong.clear()
        batches.append((time.perf_counter() - t0) / rounds * 1e6)
    stop = True
    ping.set()
    t.join(1)
    return statistics.median(batches)


def regain_us(busy_threads: int, samples: int = 400) -> dict:
    """Latency of time.sleep(0) (drops and retakes the GIL) beside `busy_threads` Python spinners."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(5e-5)
    running = True

    def spin():
        x = 0
        while running:
            x += 1

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(busy_threads)]
    for s in spinners:
        s.start()
    time.sleep(0.05)
    waits = []
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            time.sleep(0)
            waits.append((time.perf_counter() - t0) * 1e6)
    finally:
        running = False
        for s in spinners:
            s.join(1)
        sys.setswitchinterval(old + 5e-7)  # CPython cuts to whole µs: set(get()) would lose one
    waits.sort()
    return {"p50": round(waits[len(waits) // 2], 1), "p90": round(waits[int(len(waits) * 0.9)], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    result = {"cpu": cpu_facts(), "python_ms": round(python_ms(), 2), "event_us": round(event_us(), 1),
              "regain_us_1": regain_us(1), "regain_us_8": regain_us(8)}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
