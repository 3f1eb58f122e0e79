"""A CPU model of the engine's host turn (engine/host_turn.py) beside busy stream threads (issue 34).

    PYTHONPATH=python_backends:. python3 perf/bench_host_turn.py [--streams 64] [--steps 150]
        [--apply-ms 1.0] [--device-ms 8] [--turns 0,4,20] [--out x.json]

No GPU and no Triton: one "engine" thread and `--streams` "stream" threads in one interpreter,
at the stub's switch interval (0.05 ms). Each step the engine makes `--launch-calls` calls that
give the GIL up (time.sleep(0), as a torch call or a graph replay does), runs `--apply-ms` of pure
Python (applying frames), posts one event to each of `--events` streams through a HostTurn, and
then "waits for the device" (`--device-ms`, GIL released). A stream thread woken by an event
gives way (HostTurn.give_way), then runs `--stream-ms` of Python and one GIL hand-off (its send).
Reported per max wait of the turn (0 = off): the engine's host ms a step (launch + apply), the
apply ms alone, and the events' delivery-to-done latency. On the H200 the turn took the soak's
host time from 10.3 to 4.1 ms a step on one machine and left it at 17-27 ms on two others (round
10); this model asks how that depends on how long the engine's host phase is against the wait.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time

from moss_tts.engine.host_turn import HostTurn

SERVED_SWITCH_INTERVAL_S = 5e-5  # moss_tts's gil_switch_interval_ms (0.05)


def spin(seconds: float) -> None:
    """Pure Python for `seconds` (wall), as the engine's apply or a stream's per-chunk work."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def run(turn_ms: float, streams: int, steps: int, launch_calls: int, apply_ms: float, device_ms: float,
        events: int, stream_ms: float, deliver_us: int = 0) -> dict:
    feeds = [queue.SimpleQueue() for _ in range(streams)]
    latencies: list[float] = []
    lock = threading.Lock()

    def deliver(event) -> None:
        feeds[event[0]].put(event)

    turn = HostTurn(deliver, turn_ms / 1000, deliver_us / 1e6)

    def stream(feed: queue.SimpleQueue) -> None:
        while True:
            event = feed.get()
            if event is None:
                return
            turn.give_way()
            spin(stream_ms / 1000)
            time.sleep(0)  # its send: an IPC round trip with the GIL given up
            with lock:
                latencies.append(time.perf_counter() - event[1])

    threads = [threading.Thread(target=stream, args=(f,), daemon=True) for f in feeds]
    for t in threads:
        t.start()
    host, apply, gives = [], [], []
    next_stream = 0
    for _ in range(steps):
        turn.take()
        start = time.perf_counter()
        for _ in range(launch_calls):
            time.sleep(0)
        applied = time.perf_counter()
        spin(apply_ms / 1000)
        now = time.perf_counter()
        for _ in range(events):
            turn.post((next_stream, now))
            next_stream = (next_stream + 1) % streams
        end = time.perf_counter()
        host.append(end - start)
        apply.append(end - applied)
        turn.give()
        gives.append(time.perf_counter() - end)
        time.sleep(device_ms / 1000)
    turn.give()
    for f in feeds:
        f.put(None)
    for t in threads:
        t.join(10)
    with lock:
        lat = sorted(latencies)
    return {"turn_ms": turn_ms, "deliver_us": deliver_us, "host_ms_per_step": 1e3 * statistics.mean(host),
            "give_ms_per_step": 1e3 * statistics.mean(gives), "give_ms_p50": 1e3 * statistics.median(gives),
            "apply_ms_per_step": 1e3 * statistics.mean(apply),
            "event_latency_ms_p50": 1e3 * lat[len(lat) // 2], "event_latency_ms_p95": 1e3 * lat[int(len(lat) * 0.95)],
            "events_done": len(lat)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--launch-calls", type=int, default=12)
    p.add_argument("--apply-ms", type=float, default=1.0)
    p.add_argument("--device-ms", type=float, default=8.0)
    p.add_argument("--events", type=int, default=16, help="stream events per step")
    p.add_argument("--stream-ms", type=float, default=0.3)
    p.add_argument("--turns", default="0,4,20", help="max waits of the turn in ms, 0 = off")
    p.add_argument("--deliver-us", default="0", help="HostTurn's widened switch interval while it delivers, µs, "
                   "each tried with every turn > 0 (0 = not widened)")
    p.add_argument("--out")
    args = p.parse_args()
    sys.setswitchinterval(SERVED_SWITCH_INTERVAL_S)
    runs = [(float(t), int(d)) for t in args.turns.split(",")
            for d in (args.deliver_us.split(",") if float(t) > 0 else ["0"])]
    results = [run(t, args.streams, args.steps, args.launch_calls, args.apply_ms, args.device_ms,
                   args.events, args.stream_ms, d) for t, d in runs]
    print("| turn max wait ms | delivery widened to µs | host ms / step | apply ms / step | give ms / step (p50) "
          "| event latency p50 / p95 ms |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['turn_ms']:g} | {r['deliver_us']} | {r['host_ms_per_step']:.2f} | {r['apply_ms_per_step']:.2f} | "
              f"{r['give_ms_per_step']:.2f} ({r['give_ms_p50']:.2f}) | "
              f"{r['event_latency_ms_p50']:.2f} / {r['event_latency_ms_p95']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
