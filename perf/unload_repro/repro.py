"""Does a tritonserver 2.51 Python stub crash when its model unloads while it still holds a custom
metric (pb_utils.MetricFamily / Metric)?

Each run starts the real tritonserver (scripts/triton_env.sh) on a throw-away repository holding
model/ with one KEEP value, waits until it is ready, sends one request, then SIGTERM. How the stub
ended is read two ways: the kernel log (`dmesg`: "triton_python_b[PID]: segfault") for the stub's
pid, and the server log, where Python's faulthandler (FAULTHANDLER=1) writes "Fatal Python error".
README.md says why, from the python_backend r24.10 source.

    .venv/bin/python -m perf.unload_repro.repro --runs 5
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
from perf.hold_repro.repro import Server, infer_once, make_repository  # the hold repro's server runner

VARIANTS = ("family_and_metric", "nothing")


def stub_pids(server_pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(server_pid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "triton_python" in line]


def kernel_segfaults(pids: list[int]) -> list[str]:
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return [line for line in log.splitlines() if "segfault" in line and any(f"[{pid}]" in line for pid in pids)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--no-faulthandler", action="store_true", help="leave the stub's SIGSEGV to the kernel log alone")
    p.add_argument("--keep-logs", type=Path)
    args = p.parse_args()
    if subprocess.run(["dmesg"], capture_output=True).returncode != 0:
        sys.exit("dmesg cannot be read here: the kernel log is one of the two ways this reads a crash")
    counts: dict[str, collections.Counter] = {}
    for name in args.variants.split(","):
        counts[name] = collections.Counter()
        for run in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                log_path = Path(tmp) / "server.log"
                server = Server(make_repository(Path(tmp), ["metric_holder"], HERE / "model",
                                                     {"KEEP": name, "FAULTHANDLER": "0" if args.no_faulthandler else "1"}), log_path)
                server.wait_ready(["metric_holder"])
                pids = stub_pids(server.process.pid)
                infer_once(server.http_url, "metric_holder")
                took = server.stop()
                log = log_path.read_text(errors="replace")
                kernel = kernel_segfaults(pids)
                faulthandler = "Fatal Python error" in log
                result = "crashed" if kernel or faulthandler else "clean"
                counts[name][result] += 1
                counts[name]["seen_by_kernel_log"] += bool(kernel)
                counts[name]["seen_by_faulthandler"] += faulthandler
                counts[name]["unloaded"] += "successfully unloaded 'metric_holder'" in log
                if args.keep_logs:
                    args.keep_logs.mkdir(parents=True, exist_ok=True)
                    shutil.copy(log_path, args.keep_logs / f"{name}_{run}.log")
                print(f"{name} run {run}: {result} (kernel log: {bool(kernel)}, faulthandler: {faulthandler}), "
                      f"SIGTERM -> exit {took:.1f} s", flush=True)
    print(json.dumps({name: dict(c) for name, c in counts.items()}))


if __name__ == "__main__":
    main()
