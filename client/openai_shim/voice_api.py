"""Saved voices over HTTP, OpenAI's shape: POST /v1/audio/voices (multipart `audio_sample`, `name`,
`consent`), GET /v1/audio/voices, GET and DELETE /v1/audio/voices/{id}.

The upload is encoded once by the server's `ref_encoder` and stored as codes (client/voices.py);
a speech request that names the voice sends those codes as REFERENCE_CODES. `consent` is stored
as given: this server has no consent-recording API, so it is the operator's record that the
speaker agreed. Off (404) unless the shim has `--voices-dir`.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Optional

from fastapi import FastAPI, Request
from starlette.datastructures import UploadFile

from ..voices import Voice, VoiceError, VoiceStore
from .config import ShimConfig
from .errors import ApiError, bad_request, too_large
from .schema import SpeechRequest

MAX_FORM_FIELD_CHARS = 4096


def voice_error(exc: VoiceError) -> ApiError:
    codes = {400: "invalid_value", 404: "voice_not_found", 409: "voice_exists"}
    return ApiError(exc.status, str(exc), param=exc.param, code=codes.get(exc.status))


def add_voice_routes(app: FastAPI, config: ShimConfig) -> None:
    store = VoiceStore(config.voices_dir) if config.voices_dir is not None else None
    app.state.voices = store

    def require_store() -> VoiceStore:
        if store is None:
            raise ApiError(404, "saved voices are off on this server (start the shim with --voices-dir)",
                           code="not_found")
        return store

    @app.post("/v1/audio/voices")
    async def create_voice(request: Request):
        voices = require_store()
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith("multipart/form-data"):
            raise ApiError(415, "send the voice as multipart/form-data with audio_sample, name and consent",
                           param="Content-Type", code="unsupported_media_type")
        form = await request.form(max_files=1, max_fields=8, max_part_size=config.max_reference_bytes + 1)
        audio = await _file(form.get("audio_sample"), config.max_reference_bytes)
        name, consent = _text(form, "name"), _text(form, "consent")
        transcript = form.get("transcript")
        kind = form.get("type")
        if kind not in (None, "audio_sample"):
            raise bad_request("type must be 'audio_sample' (voices from text prompts are not supported)", "type")
        if not consent:
            raise bad_request("consent is required: the id of the speaker's consent record", "consent")
        codes = await request.app.state.triton.encode_reference(audio)
        try:
            voice = await asyncio.to_thread(voices.create, name, codes, hashlib.sha256(audio).hexdigest(),
                                            transcript if isinstance(transcript, str) and transcript.strip() else None)
        except VoiceError as exc:
            raise voice_error(exc) from None
        return voice.public()

    @app.get("/v1/audio/voices")
    async def list_voices():
        voices = await asyncio.to_thread(require_store().list)
        return {"object": "list", "data": [v.public() for v in voices]}

    @app.get("/v1/audio/voices/{voice_id}")
    async def get_voice(voice_id: str):
        return (await _find(require_store(), voice_id)).public()

    @app.delete("/v1/audio/voices/{voice_id}")
    async def delete_voice(voice_id: str):
        voice = await _find(require_store(), voice_id)
        await asyncio.to_thread(store.delete, voice.id)
        return {"id": voice.id, "object": "audio.voice.deleted", "deleted": True}


async def saved_voice_inputs(app: FastAPI, speech: SpeechRequest) -> dict:
    """REFERENCE_CODES (+ REFERENCE_TEXT) for a request that names a saved voice, else {}."""
    wanted = speech.saved_voice
    if wanted is None:
        return {}
    store: Optional[VoiceStore] = app.state.voices
    voice = await asyncio.to_thread(store.get, wanted) if store is not None else None
    if voice is None:
        where = "GET /v1/audio/voices lists the saved ones" if store is not None else "this server saves none"
        raise bad_request(f"{wanted!r} is not a voice of this server: MOSS-TTS has no preset voices ({where}). Use "
                          f"'default' (or an OpenAI name, same meaning), a saved voice, or clone a voice with "
                          f"ref_audio / references", "voice", code="voice_not_found")
    codes = await asyncio.to_thread(store.codes, voice)
    return {"REFERENCE_CODES": codes, "REFERENCE_TEXT": speech.reference_text or voice.transcript}


async def _find(store: VoiceStore, voice_id: str) -> Voice:
    voice = await asyncio.to_thread(store.get, voice_id)
    if voice is None:
        raise ApiError(404, f"no voice {voice_id!r} (GET /v1/audio/voices lists them)", param="voice_id",
                       code="voice_not_found")
    return voice


async def _file(value, limit: int) -> bytes:
    if not isinstance(value, UploadFile):
        raise bad_request("audio_sample is required: the recording as a file part", "audio_sample")
    data = await value.read(limit + 1)
    if len(data) > limit:
        raise too_large(f"audio_sample is larger than {limit} bytes (--max-reference-bytes)", "audio_sample")
    if not data:
        raise bad_request("audio_sample is empty", "audio_sample")
    return data


def _text(form, name: str) -> str:
    value = form.get(name)
    if value is None or isinstance(value, UploadFile):
        raise bad_request(f"{name} is required as a text field", name)
    if len(value) > MAX_FORM_FIELD_CHARS:
        raise bad_request(f"{name} has {len(value)} characters, the limit is {MAX_FORM_FIELD_CHARS}", name)
    return value.strip()
