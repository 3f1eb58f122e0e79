"""A gRPC stream whose request has ended is half-closed and read to its status, never cancelled
(client/openai_shim/triton_stream.read_to_end; the soak, the benchmark, the shim and TextSession
end their streams that way). tritonserver 2.51 can keep a model loaded for good after such a
cancel: perf/hold_repro/README.md has the source lines and the counts.

The Triton test runs the real tritonserver on perf/hold_repro's tiny decoupled model (no moss_tts):
one stream whose request Triton refuses, ended by read_to_end, leaves the model free to unload;
the same streams cancelled keep it loaded past SIGTERM (the 24.10 gRPC frontend's leak that the
rule avoids; if a later tritonserver stops holding it, this test says so)."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from client.openai_shim.triton_stream import read_to_end


class FakeCall:
    """A stream call: ends (the server's status) after `responses` responses, or never."""

    def __init__(self, responses: int, ends: bool = True) -> None:
        self.responses, self.ends, self.is_cancelled = responses, ends, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.responses:
            self.responses -= 1
            return object()
        if self.ends:
            raise StopAsyncIteration
        await asyncio.Event().wait()

    def cancel(self) -> bool:
        self.is_cancelled = True
        return True


def test_read_to_end_half_closes_and_reads_on_without_a_cancel():
    call, closed = FakeCall(responses=1), asyncio.Event()
    asyncio.run(read_to_end(call, closed, timeout_s=5.0))
    assert closed.is_set() and call.responses == 0 and not call.is_cancelled


def test_read_to_end_cancels_only_a_stream_the_server_does_not_end():
    call, closed = FakeCall(responses=0, ends=False), asyncio.Event()
    asyncio.run(read_to_end(call, closed, timeout_s=0.05))
    assert closed.is_set() and call.is_cancelled


def refused_stream(url: str, model: str, end: str) -> str:
    """One stream whose only request Triton refuses (CHUNKS as FP32); ended by `end`."""
    import tritonclient.grpc.aio as grpcclient

    async def run() -> str:
        client = grpcclient.InferenceServerClient(url)
        closed = asyncio.Event()
        tensor = grpcclient.InferInput("CHUNKS", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], np.float32))
        inputs = [tensor]
        for name, dtype, value in (("GAP_MS", "INT32", np.int32(1)), ("FINAL_WITH_DATA", "BOOL", np.bool_(False))):
            inputs.append(grpcclient.InferInput(name, [1], dtype))
            inputs[-1].set_data_from_numpy(np.array([value]))

        async def requests():
            yield {"model_name": model, "inputs": inputs}
            await closed.wait()

        call = client.stream_infer(requests())
        _, error = await call.__anext__()
        if end == "read_to_end":
            await read_to_end(call, closed)
        else:
            call.cancel()
        closed.set()
        await client.close()
        return error.message() if error is not None else "no error"

    return asyncio.run(run())


def skip_without_tritonserver() -> None:
    """The Triton tests here start the real tritonserver (scripts/triton_env.sh): skipped where none is."""
    from perf.hold_repro import repro

    try:
        env = repro.triton_env()
    except subprocess.CalledProcessError:
        pytest.skip("scripts/triton_env.sh failed: no tritonserver here")
    if not Path(env.get("TRITONSERVER", "")).exists():
        pytest.skip("no tritonserver binary")


@pytest.mark.triton
def test_refused_stream_read_to_end_lets_the_model_unload_a_cancelled_one_does_not(tmp_path):
    from perf.hold_repro import repro

    skip_without_tritonserver()
    names = ["hold_read_to_end", "hold_cancelled"]
    server = repro.Server(repro.make_repository(tmp_path, names), tmp_path / "server.log", exit_timeout_s=3)
    try:
        server.wait_ready(names)
        url = f"127.0.0.1:{server.grpc}"
        errors = [refused_stream(url, "hold_read_to_end", "read_to_end")]
        errors += [refused_stream(url, "hold_cancelled", "cancel") for _ in range(3)]
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert all("data-type is 'FP32'" in e for e in errors), errors  # refused by Triton, not the model
    assert "successfully unloaded 'hold_read_to_end'" in log, log[-3000:]
    held = "successfully unloaded 'hold_cancelled'" not in log
    live = re.findall(r"Found (\d+) live models", log)
    assert held and live and live[-1] == "1", (
        "this tritonserver unloaded a model whose refused streams were cancelled: the gRPC frontend "
        "leak of perf/hold_repro/README.md (ordering L3) is gone from this build; read_to_end is still "
        f"the right way to end a stream, but update the README. Log tail:\n{log[-2000:]}")


@pytest.mark.triton
def test_the_wedge_driver_serves_and_cancels_streams_mid_send(tmp_path):
    """perf/hold_repro/wedge.py, briefly: every stream gets its first response and is cancelled
    while the model still sends (the deadlock's ingredients, docs/structure.md); the driver
    counts them and says no wedge when streams keep being served."""
    import asyncio

    from perf.hold_repro import repro, wedge

    skip_without_tritonserver()
    server = repro.Server(repro.make_repository(tmp_path, [wedge.MODEL]), tmp_path / "server.log", exit_timeout_s=3)
    try:
        server.wait_ready([wedge.MODEL])
        o = repro.Ordering(50, 1, False, False, "cancel")
        result = asyncio.run(wedge.drive(f"127.0.0.1:{server.grpc}", o, streams=8, seconds=4.0, stall_s=10.0, seed=0))
    finally:
        server.stop()
    assert result["served"] > 50 and result["served"] <= result["streams"], result
    assert result["wedged_after_s"] is None, result
