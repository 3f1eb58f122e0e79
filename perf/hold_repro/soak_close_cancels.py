"""How many streams does perf/soak.py cancel by closing its channel at the end of its load?

Runs the soak's load (`run_load`, the test's mix) against the project's server (tiny checkpoint)
with grpc.aio's cancel instrumented, then SIGTERM. A cancel at the channel close is a stream that
had its final but not yet its status: the ordering that can leave moss_tts held (README.md).
`--soak-file` loads another version of the load (perf/soak_load.py; before the split, perf/soak.py
held it), e.g. the one before the fix:

    git show 685f33e:perf/soak.py > /tmp/soak_old.py
    .venv/bin/python -m perf.hold_repro.soak_close_cancels --soak-file /tmp/soak_old.py
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_soak(path: Path):
    spec = importlib.util.spec_from_file_location("soak_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def count_cancels() -> dict:
    """Count cancels of calls not yet done: at InferenceServerClient.close() or elsewhere."""
    import tritonclient.grpc.aio as aio
    from grpc.aio import _call

    counts = {"at_channel_close": 0, "elsewhere": 0, "_closing": False}
    cancel, close = _call.Call._cancel, aio.InferenceServerClient.close

    def counted_cancel(self, details):
        if not self._cython_call.done():
            counts["at_channel_close" if counts["_closing"] else "elsewhere"] += 1
        return cancel(self, details)

    async def counted_close(self):
        counts["_closing"] = True
        try:
            return await close(self)
        finally:
            counts["_closing"] = False

    _call.Call._cancel, aio.InferenceServerClient.close = counted_cancel, counted_close
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--soak-file", type=Path, default=ROOT / "perf" / "soak_load.py")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--tiny", type=Path, default=Path(tempfile.gettempdir()) / "hold_repro_tiny")
    args = p.parse_args()
    from tests.triton_server import start_server, stop_server

    if not (args.tiny / "model").exists():
        from moss_tts.tools.make_tiny_checkpoint import main as make_tiny

        make_tiny([str(args.tiny), "--seed", "0"])
    soak = load_soak(args.soak_file)
    counts = count_cancels()
    log = Path(tempfile.mkdtemp()) / "server.log"
    server = start_server(args.tiny / "model", args.tiny / "codec", log, args=("--exit-timeout-secs=8",))
    try:
        config = soak.SoakConfig(server.grpc_url, concurrency=12, seconds=args.seconds, cancel_fraction=0.25,
                                 bad_fraction=0.1, min_frames=4, max_frames=24, response_timeout_s=60.0)
        report = asyncio.run(soak.run_load(config))
        time.sleep(2.0)
    finally:
        stop_server(server)
    print(json.dumps({"soak": str(args.soak_file), "requests": sum(report.outcomes.values()),
                      "failures": len(report.failures), "cancels_at_channel_close": counts["at_channel_close"],
                      "cancels_elsewhere": counts["elsewhere"],
                      "moss_tts_unloaded": "successfully unloaded 'moss_tts'" in log.read_text(errors="replace")}))


if __name__ == "__main__":
    main()
