"""Does tritonserver 2.51 crash at SIGTERM when a Python stub sends BLS calls during its finalize()?

Each run starts the real tritonserver (scripts/triton_env.sh) on a throw-away repository holding
model/ with one set of parameters, waits until it is ready, idles SETTLE_S, sends SIGTERM and
reads the log: "Signal (11)"/"Signal (6)" is a crash, "successfully unloaded" a clean unload.
README.md says why (python_backend r24.10 source lines).

    .venv/bin/python -m perf.finalize_repro.repro --runs 5
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
from perf.hold_repro.repro import Server, infer_once, make_repository  # the hold repro's server runner

VARIANTS = {
    # The probe runs on through finalize(), as the stop watch of an instance that never served did.
    "probe_through_finalize": {},
    # moss_tts's stop watch since the fix: asks only after a request, stops at the first "Server not
    # ready" after it (here every 500 ms; moss_tts asks every 250 ms).
    "armed_stop_at_not_ready": {"ARMED_BY_REQUEST": "1", "STOP_AT_NOT_READY": "1", "PROBE_MS": "500"},
}


def outcome(log: str) -> str:
    if "Signal (11)" in log or "Signal (6)" in log:
        return "crashed"
    if "successfully unloaded 'probe'" in log:
        return "unloaded"
    return "held"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--probe-ms", type=int, default=50)
    p.add_argument("--finalize-s", type=float, default=2.0)
    p.add_argument("--busy-threads", type=int, default=0, help="threads spinning Python code in the stub")
    p.add_argument("--settle-s", type=float, default=1.0)
    p.add_argument("--keep-logs", type=Path)
    args = p.parse_args()
    counts: dict[str, collections.Counter] = {}
    for name in args.variants.split(","):
        params = {"PROBE_MS": str(args.probe_ms), **VARIANTS[name], "FINALIZE_S": str(args.finalize_s),
                  "BUSY_THREADS": str(args.busy_threads)}
        counts[name] = collections.Counter()
        for run in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                repo = make_repository(Path(tmp), ["probe"], HERE / "model", params)
                log_path = Path(tmp) / "server.log"
                server = Server(repo, log_path, exit_timeout_s=15)
                try:
                    server.wait_ready(["probe"])
                except RuntimeError:  # it crashed while loading: the same defect, before SIGTERM
                    took = server.stop()
                    result = "crashed_at_start" if outcome(log_path.read_text(errors="replace")) == "crashed" else "no_start"
                else:
                    infer_once(server.http_url, "probe")
                    time.sleep(args.settle_s)
                    took = server.stop()
                    result = outcome(log_path.read_text(errors="replace"))
                counts[name][result] += 1
                print(f"{name} run {run}: {result}, SIGTERM -> exit {took:.1f} s", flush=True)
                if args.keep_logs:
                    args.keep_logs.mkdir(parents=True, exist_ok=True)
                    shutil.copy(log_path, args.keep_logs / f"{name}_{run}.log")
    print(json.dumps({name: dict(c) for name, c in counts.items()}))


if __name__ == "__main__":
    main()
