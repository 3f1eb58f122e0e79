"""Where a py-spy record of the moss_tts stub went, by thread kind and by frame (issue 34).

    python3 perf/pyspy_share.py record.txt[.gz] [--thread engine] [--top 15] [--native] [--seconds 40 --rate 50]

Reads py-spy's raw (collapsed) output, as perf/h200_scaling.sh writes it (`RECORD=...`,
`record_NAME_*.txt`, committed gzipped under perf/results/): one line per distinct stack,
"thread (tid): name;frame;frame... count". Prints
  - the samples per thread kind (engine, vocoder, stream, execute, main, gauges, other) and their
    share; with --seconds and --rate, also the share of all sampling instants (for a `gil`
    record: the fraction of the time some thread held the GIL);
  - the heaviest leaves: each stack's last two Python frames (function:line), or with --native
    its last Python frame and last two native frames (where a thread waited for the GIL: a
    pthread_cond_timedwait under the call that gave the GIL up), per kind or for --thread only.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
import sys
from pathlib import Path

KINDS = (("engine", "moss-tts-engine"), ("vocoder", "moss-vocoder-worker"), ("stream", "-stream_"),
         ("gauges", "-gauges"), ("main", "MainThread"))


def load(path: Path) -> list[tuple[list[str], int]]:
    """[(frames, count)]: frames[0] is the thread ("thread (tid): name"), then outermost first."""
    opener = gzip.open if path.suffix == ".gz" else open
    stacks = []
    with opener(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                stacks.append((stack.split(";"), int(count)))
    return stacks


def kind(frames: list[str]) -> str:
    """The thread's kind by its name; execute() runs on the stub's main thread and counts apart."""
    if any("TritonPythonModel.execute" in f for f in frames):
        return "execute"
    for name, marker in KINDS:
        if marker in frames[0]:
            return name
    return "other"


def short(frame: str) -> str:
    """"Engine._apply (moss_tts/engine/engine.py:255)" -> "Engine._apply:255"; native frames as named."""
    line = re.search(r":(\d+)\)$", frame)
    return frame.split(" (")[0] + (f":{line.group(1)}" if line else "")


def leaf(frames: list[str], native: bool) -> str:
    python = [f for f in frames[1:] if ".py:" in f]
    if not native:
        return " > ".join(short(f) for f in python[-2:])
    tail = [f for f in frames[1:] if ".py:" not in f][-2:]
    return " > ".join([short(f) for f in python[-1:]] + [short(f) for f in tail])


def shares(stacks, native: bool = False, thread: str | None = None):
    """({kind: samples}, {(kind, leaf): samples}) over the stacks (of `thread`'s kind only, if given)."""
    by_kind, by_leaf = collections.Counter(), collections.Counter()
    for frames, count in stacks:
        k = kind(frames)
        if thread is None or k == thread:
            by_kind[k] += count
            by_leaf[(k, leaf(frames, native))] += count
    return by_kind, by_leaf


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("record", type=Path)
    p.add_argument("--thread", choices=[k for k, _ in KINDS] + ["execute", "other"])
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--native", action="store_true", help="leaves with their native frames")
    p.add_argument("--seconds", type=float, help="the record's length: share of all sampling instants")
    p.add_argument("--rate", type=float, default=50.0, help="py-spy's samples a second (h200_scaling: 50)")
    args = p.parse_args(argv)
    by_kind, by_leaf = shares(load(args.record), args.native, args.thread)
    total = sum(by_kind.values())
    if not total:
        sys.exit(f"{args.record}: no samples")
    print(f"{args.record}: {total} samples" + (f", {total / (args.seconds * args.rate):.0%} of the sampling instants"
                                                if args.seconds else ""))
    for k, n in by_kind.most_common():
        print(f"  {k:8s} {n:7d}  {n / total:6.1%}")
    print(f"heaviest leaves (share of the {'thread kind' if args.thread else 'record'}):")
    for (k, name), n in by_leaf.most_common(args.top):
        print(f"  {n / total:6.1%}  {k:8s} {name}")


if __name__ == "__main__":
    main()
