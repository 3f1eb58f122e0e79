"""Settings of the OpenAI-compatible shim, validated once at start-up."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

MIB = 1 << 20
DEFAULT_MODEL_NAMES = ("moss-tts", "OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5")
# OpenAI's speech models, the names Pipecat (gpt-4o-mini-tts) and LiveKit (gpt-4o-mini-tts; tts-1 for
# its raw-audio path) send unless told otherwise: served by default as aliases of the one model.
OPENAI_MODEL_NAMES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class ConfigError(ValueError):
    """A setting is out of range; the message names the flag."""


@dataclass(frozen=True)
class ShimConfig:
    triton_url: str = "localhost:8001"  # tritonserver gRPC address
    triton_model: str = "moss_tts"
    model_names: tuple[str, ...] = DEFAULT_MODEL_NAMES  # ids accepted in `model` and listed by /v1/models
    model_aliases: tuple[str, ...] = OPENAI_MODEL_NAMES  # more ids for the same model, listed after them
    host: str = "0.0.0.0"
    port: int = 8080
    max_body_bytes: int = 48 * MIB  # a 100 s 48 kHz stereo 16-bit WAV as a data URI is ~26 MiB
    max_input_chars: int = 20000  # the server's own limit on TEXT
    max_reference_bytes: int = 32 * MIB  # decoded reference audio, whatever its source
    reference_dir: Optional[Path] = None  # local `audio_path` references only inside it; None = off
    voices_dir: Optional[Path] = None  # saved voices (client/voices.py); None = /v1/audio/voices off
    allow_url_references: bool = False
    allow_private_url_hosts: bool = False  # URL references to loopback/private/link-local hosts
    url_timeout_s: float = 10.0  # whole download of one URL reference
    response_timeout_s: float = 300.0  # longest wait for the next Triton response -> 504
    health_timeout_s: float = 2.0
    # tritonserver's metrics, where the models' heartbeats are read (client/server_health.py);
    # None = port 8002 on the host of triton_url, "" = no heartbeat check.
    metrics_url: Optional[str] = None
    heartbeat_stale_s: float = 3.0  # a model heartbeat this old makes /health and every request 503
    # The WebSocket (speech_ws.py): a connection without a message this long is closed (its contexts
    # cancelled); text of a context not yet spoken beyond this many characters closes it too; at most
    # this many contexts (text sessions) open on one connection at once (ElevenLabs allows 5).
    ws_idle_timeout_s: float = 30.0
    ws_max_buffered_chars: int = 10000
    ws_max_contexts: int = 8

    def __post_init__(self) -> None:
        if not self.model_names or any(not name.strip() for name in self.model_names):
            raise ConfigError("--served-model-name: give at least one non-empty name")
        if any(not name.strip() for name in self.model_aliases):
            raise ConfigError("--model-alias: a name must not be empty")
        if not (0 <= self.port < 65536):
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        for flag, value in (("--max-body-bytes", self.max_body_bytes), ("--max-input-chars", self.max_input_chars),
                            ("--max-reference-bytes", self.max_reference_bytes),
                            ("--ws-max-buffered-chars", self.ws_max_buffered_chars),
                            ("--ws-max-contexts", self.ws_max_contexts)):
            if value < 1:
                raise ConfigError(f"{flag} must be positive, got {value}")
        for flag, value in (("--url-timeout", self.url_timeout_s), ("--response-timeout", self.response_timeout_s),
                            ("--health-timeout", self.health_timeout_s), ("--heartbeat-stale", self.heartbeat_stale_s),
                            ("--ws-idle-timeout", self.ws_idle_timeout_s)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{flag} must be a positive number of seconds, got {value}")
        if self.voices_dir is not None:
            try:
                Path(self.voices_dir).expanduser().mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"--voices-dir {self.voices_dir}: {exc.strerror}") from None
            object.__setattr__(self, "voices_dir", Path(self.voices_dir).expanduser().resolve())
        if self.reference_dir is not None:
            resolved = Path(self.reference_dir).expanduser().resolve()
            if not resolved.is_dir():
                raise ConfigError(f"--reference-dir {self.reference_dir} is not a directory")
            object.__setattr__(self, "reference_dir", resolved)

    @property
    def default_model(self) -> str:
        return self.model_names[0]

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every id a request may name: the model's names, then its aliases (no repeats)."""
        return tuple(dict.fromkeys(self.model_names + self.model_aliases))

    def serves(self, model: str) -> bool:
        return model in self.served_names

    @property
    def heartbeat_url(self) -> Optional[str]:
        """Where the heartbeats are read, or None when the check is off."""
        if self.metrics_url is None:
            from ..server_health import metrics_url_for
            return metrics_url_for(self.triton_url)
        return self.metrics_url or None
