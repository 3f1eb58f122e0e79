"""A shim worker's start: the speech path run once before any client waits on it."""

from __future__ import annotations

import asyncio

import anyio
import numpy as np

from .audio_output import AudioOutput
from .schema import SpeechRequest, triton_options
from .triton_stream import TritonSpeech


async def warm_up(triton: TritonSpeech) -> None:
    """A worker's first streamed response paid ~60-130 ms more than the next (issue 31; on the H200
    one of two requests at one stream took 162 ms instead of 29): run the speech path's code once
    (parse, options, the pcm conversion, anyio's first task group) and connect the gRPC channel
    before any client waits on them. In the background: tritonserver may not be up yet
    (scripts/serve.sh starts both)."""
    speech = SpeechRequest.model_validate_json(b'{"input": "warm up", "response_format": "pcm"}')
    triton_options(speech)
    output = AudioOutput(speech.output)
    output.push(np.zeros((2, 3840), np.float32))
    output.finish()
    async with anyio.create_task_group() as group:  # CancellingStreamingResponse's: anyio imports
        group.start_soon(asyncio.sleep, 0)           # its asyncio backend at the first one, ~50 ms
    await triton.problem(timeout_s=5.0)
