"""The `POST /v1/audio/speech` body: OpenAI's fields + SGLang-Omni's MOSS fields, nothing else.

Unknown fields are errors (`extra="forbid"`), and so are known fields this server cannot honour
(`speed` other than 1.0, preset voices it does not have). Ranges mirror the server's own checks
so that the error names the JSON field; the server still validates everything again.
`triton_options()` is the whole mapping of fields to `moss_tts` inputs; `output` is what the
response carries (format, rate, channels: audio_format.OutputSpec).

Streaming, as OpenAI: a response streams unless the body says `"stream": false` (SGLang-Omni's
field; then one whole body with a Content-Length and completed headers). Pipecat and LiveKit send
no `stream` and read the body as it arrives.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from moss_tts.contract import tensors as contract

from .audio_format import FORMATS, UNSUPPORTED, OutputSpec, SpecError

# The model has no preset voices: "default" and OpenAI's built-in names all mean "no reference"
# (the model picks a voice from the text); cloning takes `ref_audio` or `references`.
VOICES = ("default", "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
          "verse", "marin", "cedar")
TASK_TYPES = contract.MODES
INT32_MAX = 2**31 - 1  # TOP_K is an int32 input: a larger value would wrap on the wire

Temperature = Annotated[float, Field(ge=0.0, le=contract.MAX_TEMPERATURE)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=-1, le=INT32_MAX)]
Penalty = Annotated[float, Field(gt=0.0, le=contract.MAX_REPETITION_PENALTY)]
# The server's MAX_FRAMES / TOKENS cap; a request must also fit the engine's max_seq_len, which
# the server checks (400 with the numbers).
Frames = Annotated[int, Field(ge=1, le=contract.MAX_FRAMES)]


def _conflict(param: str, message: str) -> PydanticCustomError:
    return PydanticCustomError("conflict", message, {"param": param})


class Reference(BaseModel):
    """One reference of SGLang-Omni's `references` list: audio (one of three names) + transcript."""

    model_config = ConfigDict(extra="forbid", strict=True)
    audio_path: Optional[str] = None
    ref_audio: Optional[str] = None
    audio: Optional[str] = None
    text: Optional[str] = None

    @model_validator(mode="after")
    def _one_source(self) -> "Reference":
        given = [name for name in ("audio_path", "ref_audio", "audio") if getattr(self, name) is not None]
        if len(given) != 1:
            raise PydanticCustomError("reference_source", "give exactly one of audio_path, ref_audio or audio "
                                      "(a data: URI, an http(s) URL or a path under the reference directory)")
        return self

    @property
    def source_field(self) -> str:
        return next(name for name in ("audio_path", "ref_audio", "audio") if getattr(self, name) is not None)


class VoiceRef(BaseModel):
    """OpenAI's custom-voice form: `"voice": {"id": "voice_..."}`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str = Field(min_length=1)


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # OpenAI
    model: Optional[str] = None
    input: str = Field(min_length=1, max_length=contract.MAX_TEXT_CHARS)
    # A preset name (no reference), a saved voice's name or id, or OpenAI's {"id": "voice_..."}.
    voice: Union[str, VoiceRef] = Field("default", validation_alias=AliasChoices("voice", "speaker"),
                                        union_mode="left_to_right")
    response_format: str = "wav"
    speed: float = 1.0
    instructions: Optional[str] = None
    stream_format: Literal["audio", "sse"] = "audio"
    # Extension: the response's rate and channels (default OpenAI's 24000 and 1; 48000 and 2 are the
    # server's own stream, unconverted)
    sample_rate: Optional[int] = None
    channels: Optional[int] = None
    # SGLang-Omni (spec section 4.2)
    stream: Optional[bool] = None
    task_type: Optional[str] = None
    language: Optional[str] = None
    references: Optional[list[Reference]] = Field(None, min_length=1, max_length=1)
    ref_audio: Optional[str] = None
    ref_text: Optional[str] = None
    token_count: Optional[Frames] = None
    duration_tokens: Optional[Frames] = None
    tokens: Optional[Frames] = None
    temperature: Optional[Temperature] = None
    top_p: Optional[TopP] = None
    top_k: Optional[TopK] = None
    repetition_penalty: Optional[Penalty] = None
    audio_temperature: Optional[Temperature] = None
    audio_top_p: Optional[TopP] = None
    audio_top_k: Optional[TopK] = None
    audio_repetition_penalty: Optional[Penalty] = None
    text_temperature: Optional[Temperature] = None
    text_top_p: Optional[TopP] = None
    text_top_k: Optional[TopK] = None
    seed: Optional[int] = Field(None, ge=0, le=2**63 - 1)
    max_new_tokens: Optional[Frames] = None
    initial_codec_chunk_frames: Optional[int] = Field(None, ge=0, le=contract.MAX_CHUNK_FRAMES)
    # Extension: keep generating to max_new_tokens even when the model would stop (benchmarks, tests).
    ignore_stop: bool = False
    _output: Optional[OutputSpec] = PrivateAttr(None)

    @field_validator("voice", mode="wrap")
    @classmethod
    def _voice_form(cls, value, handler):
        """One clear message (not one per union member) for a voice of neither form."""
        if isinstance(value, str) or (isinstance(value, dict) and set(value) == {"id"} and isinstance(value["id"], str)):
            return handler(value)
        raise ValueError('must be a voice name (a string) or {"id": "voice_..."} (a saved voice)')

    @property
    def saved_voice(self) -> Optional[str]:
        """The saved voice's id or name this request names, or None for a preset name."""
        if isinstance(self.voice, VoiceRef):
            return self.voice.id
        return None if self.voice.strip().lower() in VOICES else self.voice.strip()

    @field_validator("response_format")
    @classmethod
    def _known_format(cls, name: str) -> str:
        if name not in FORMATS:
            why = "has no encoder here" if name in UNSUPPORTED else "is unknown"
            raise ValueError(f"{name!r} {why}; supported: {', '.join(FORMATS)}")
        return name

    @field_validator("speed")
    @classmethod
    def _no_speed(cls, speed: float) -> float:
        if speed != 1.0:
            raise ValueError("not supported: MOSS-TTS has no speed control; leave it at 1.0 and set the "
                             "duration with token_count (12.5 frames per second) instead")
        return speed

    @field_validator("task_type")
    @classmethod
    def _known_task(cls, task: Optional[str]) -> Optional[str]:
        if task is not None and task.strip().lower() not in TASK_TYPES:
            raise ValueError(f"must be one of {sorted(TASK_TYPES)}, got {task!r}")
        return task

    @model_validator(mode="after")
    def _consistent(self) -> "SpeechRequest":
        if self.saved_voice is not None and (self.references is not None or self.ref_audio is not None):
            raise _conflict("voice", "a saved voice is a reference already: drop ref_audio / references, or use "
                            "voice 'default'")
        if self.references is not None and (self.ref_audio is not None or self.ref_text is not None):
            raise _conflict("ref_audio", "give either references or ref_audio/ref_text, not both")
        if self.ref_text is not None and self.ref_audio is None and self.saved_voice is None:
            raise _conflict("ref_text", "ref_text is the transcript of the reference audio: give ref_audio too")
        _agree(self, ("token_count", "duration_tokens", "tokens"))
        for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
            _agree(self, (name, f"audio_{name}"))
        if self.stream is False and self.stream_format == "sse":
            raise _conflict("stream", "stream_format 'sse' always streams: drop stream=false or use "
                            "stream_format 'audio'")
        try:
            self._output = OutputSpec.of(self.response_format, self.sample_rate, self.channels)
        except SpecError as exc:
            raise _conflict(exc.param, str(exc)) from None
        if self.mode == "continuation" and self.reference is None and self.saved_voice is None:
            raise _conflict("task_type", "task_type 'continuation' needs the audio to continue: ref_audio "
                            "(+ ref_text, its transcript) or references[0]")
        return self

    @property
    def is_streaming(self) -> bool:
        return self.stream is not False

    @property
    def output(self) -> OutputSpec:
        """The response's format, sample rate and channels."""
        return self._output

    @property
    def mode(self) -> str:
        return TASK_TYPES[(self.task_type or "clone").strip().lower()]

    @property
    def reference(self) -> Optional[tuple[str, str]]:
        """(JSON path of the field, audio source) or None."""
        if self.ref_audio is not None:
            return "ref_audio", self.ref_audio
        if self.references:
            ref = self.references[0]
            return f"references.0.{ref.source_field}", getattr(ref, ref.source_field)
        return None

    @property
    def reference_text(self) -> Optional[str]:
        return self.references[0].text if self.references else self.ref_text


def _agree(request: SpeechRequest, names: tuple[str, ...]) -> None:
    values = {name: getattr(request, name) for name in names if getattr(request, name) is not None}
    if len(set(values.values())) > 1:
        raise _conflict(names[-1], f"{' / '.join(values)} are the same setting and disagree: {values}")


def _first(request: SpeechRequest, *names: str):
    return next((getattr(request, name) for name in names if getattr(request, name) is not None), None)


def triton_options(request: SpeechRequest) -> dict[str, object]:
    """Triton input name -> value for every option the request sets (None = not sent = default).
    TEXT and REFERENCE_AUDIO are added by the caller (the reference needs resolving first)."""
    language = request.language
    first_chunk = request.initial_codec_chunk_frames
    return {
        "INSTRUCTIONS": request.instructions,
        "LANGUAGE": None if language is None or language.strip().lower() == "auto" else language,
        "TOKENS": _first(request, "token_count", "duration_tokens", "tokens"),
        "TEMPERATURE": _first(request, "audio_temperature", "temperature"),
        "TOP_P": _first(request, "audio_top_p", "top_p"),
        "TOP_K": _first(request, "audio_top_k", "top_k"),
        "REPETITION_PENALTY": _first(request, "audio_repetition_penalty", "repetition_penalty"),
        "STOP_TEMPERATURE": request.text_temperature,
        "STOP_TOP_P": request.text_top_p,
        "STOP_TOP_K": request.text_top_k,
        "SEED": request.seed,
        "MAX_FRAMES": request.max_new_tokens,
        "FIRST_CHUNK_FRAMES": first_chunk or None,  # 0 = the server's default
        "IGNORE_STOP": True if request.ignore_stop else None,
        "REFERENCE_TEXT": request.reference_text,
        "MODE": "continuation" if request.mode == "continuation" else None,
        "STREAM": True,  # the shim always streams from Triton; it buffers for whole responses
    }
