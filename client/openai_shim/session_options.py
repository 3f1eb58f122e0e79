"""The WebSocket's options message (docs/websocket.md) -> SessionOptions + the session's moss_tts inputs.

Everything the options name is checked here, before the connection answers session.started, so
that a bad message is an `error` event the client can follow with other options: the schema and
the model as POST /v1/audio/speech checks them, a saved voice, and a reference. A reference is
encoded once, by the server's `ref_encoder` (undecodable or too long audio: the same 4xx as the
HTTP endpoint), and its codes go with the session's first request as REFERENCE_CODES instead of
the audio; sent as audio, a bad reference would only fail the session at the first text.
"""

from __future__ import annotations

import json
from typing import Optional

from fastapi import FastAPI
from pydantic import Field, ValidationError, field_validator

from . import errors
from .config import ShimConfig
from .references import load_reference
from .schema import SpeechRequest, triton_options
from .voice_api import saved_voice_inputs


class SessionOptions(SpeechRequest):
    """The first message: POST /v1/audio/speech's fields without `input` (the text comes later) and
    always streaming; response_format pcm (default) or wav, at OpenAI's 24 kHz mono unless
    `sample_rate` / `channels` say otherwise, as over HTTP."""

    type: str = Field("options", pattern="^options$")
    input: str = ""
    # ElevenLabs' range: the socket's idle timeout in seconds (None: --ws-idle-timeout); socket-wide.
    inactivity_timeout: Optional[float] = Field(None, ge=20, le=180)
    response_format: str = "pcm"
    stream: Optional[bool] = True

    @field_validator("response_format")
    @classmethod
    def _raw_format(cls, name: str) -> str:
        if name not in ("pcm", "wav"):
            raise ValueError(f"the WebSocket sends pcm or wav, not {name!r}")
        return name

    @field_validator("input")
    @classmethod
    def _no_input(cls, text: str) -> str:
        if text:
            raise ValueError('the text comes in {"type": "text"} messages, not with the options')
        return text


# One audio format per socket: a named context's options may repeat these, not change them.
SOCKET_FIELDS = ("response_format", "sample_rate", "channels", "inactivity_timeout")


async def session_inputs(data: dict, app: FastAPI, config: ShimConfig) -> tuple[SessionOptions, dict]:
    """The options and the moss_tts inputs of every request (the voice ones go with the first
    only: SessionRequests); ApiError, as the HTTP endpoint would answer, for bad options."""
    try:
        speech = SessionOptions.model_validate_json(json.dumps(data))
    except ValidationError as exc:
        raise errors.from_validation(exc) from None
    if speech.model is not None and not config.serves(speech.model):
        raise errors.model_not_found(speech.model, config.served_names)
    values = {**triton_options(speech), **await saved_voice_inputs(app, speech)}
    if speech.reference is not None:
        audio = await load_reference(*speech.reference, config)
        values["REFERENCE_CODES"] = await app.state.triton.encode_reference(audio)
    return speech, values


async def context_inputs(data: dict, socket: SessionOptions, app: FastAPI,
                         config: ShimConfig) -> tuple[SessionOptions, dict]:
    """A named context's own options (docs/websocket.md, "Contexts"): the whole schema, nothing of
    the socket's merged in but its output format, which a context may not change (every context's
    audio is decoded by one client player); ApiError as session_inputs."""
    spec = socket.output
    fixed = {"response_format": spec.format.name, "sample_rate": spec.sample_rate, "channels": spec.channels,
             "inactivity_timeout": socket.inactivity_timeout}
    for name in SOCKET_FIELDS:
        if data.get(name) is not None and data[name] != fixed[name]:
            raise errors.bad_request(f"{name} is the socket's ({fixed[name]!r}, from the first options message) for "
                                     f"every context; got {data[name]!r}", name, code="socket_option")
    return await session_inputs({**data, **fixed}, app, config)
