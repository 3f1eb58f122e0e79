"""What a response carries: its format, sample rate and channel count (`OutputSpec`).

The server makes 48 kHz stereo float32 (`SAMPLE_RATE`, `CHANNELS`). Every format carries OpenAI's
audio unless the request says otherwise: 24 kHz mono (`OPENAI_SAMPLE_RATE`, `OPENAI_CHANNELS`).
Why every format, not only `pcm` (README, "Voice agents", has the measurements):
- `pcm` has no header: Pipecat and LiveKit frame its bytes as 24 kHz mono s16le, as OpenAI defines it.
- `wav`: LiveKit's WAV decoder resamples the header's rate to 24 kHz but keeps its channel count,
  while the plugin declares one channel; 48 kHz stereo reached its listeners as 2-channel frames.
- `mp3`, `opus`, `aac`, `flac`: LiveKit decodes them with PyAV and converts to 24 kHz mono itself,
  so any rate works there; OpenAI's rate and layout keep a client's bytes and CPU at OpenAI's cost.
The extension fields `sample_rate` and `channels` ask for another rate or layout; 48000 + 2 is the
server's own stream, sent without any conversion.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

try:
    import av
except ImportError:  # a shim without PyAV (FFmpeg's encoders): pcm and wav only, the rest UNSUPPORTED
    av = None  # (the H200 device pack: PyAV's 36 MB wheel does not fit its 64 MiB)

SAMPLE_RATE = 48000  # Hz, the MOSS-Audio-Tokenizer-v2 output rate
CHANNELS = 2
SAMPLES_PER_FRAME = 3840  # per channel at SAMPLE_RATE: one 80 ms codec frame
OPENAI_SAMPLE_RATE = 24000  # Hz: OpenAI's pcm (24 kHz, 16-bit, mono)
OPENAI_CHANNELS = 1
# The rates a response may have: each holds a whole number of samples per 80 ms frame, so a frame
# count is an exact length at every rate.
SAMPLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
CHANNEL_COUNTS = (1, 2)


def seconds(frames: int) -> float:
    """Where `frames` 80 ms frames end, in seconds: computed from the whole count each time (not
    summed), so one segment's end_s equals the next one's start_s exactly."""
    return frames * SAMPLES_PER_FRAME / SAMPLE_RATE


@dataclass(frozen=True)
class AudioFormat:
    name: str
    media_type: str
    muxer: Optional[str]  # FFmpeg's container; None: written here (raw pcm, wav)
    codec: Optional[str]  # FFmpeg's encoder
    sample_format: Optional[str]  # X-Sample-Format; None for lossy codecs
    sample_rates: tuple[int, ...] = SAMPLE_RATES  # of SAMPLE_RATES, the ones its encoder takes

    @property
    def is_lossless(self) -> bool:
        return self.sample_format is not None


def _with_encoder_rates(fmt: AudioFormat) -> Optional[AudioFormat]:
    """`fmt` limited to the rates its encoder takes; None when this FFmpeg build lacks the encoder."""
    if fmt.codec is None:
        return fmt
    if av is None or fmt.codec not in av.codecs_available:
        return None
    rates = av.codec.Codec(fmt.codec, "w").audio_rates  # None: any rate
    return replace(fmt, sample_rates=tuple(rate for rate in fmt.sample_rates if rates is None or rate in rates))


_CANDIDATES = (
    AudioFormat("wav", "audio/wav", None, None, "s16le"),
    AudioFormat("pcm", "audio/pcm", None, None, "s16le"),
    AudioFormat("flac", "audio/flac", "flac", "flac", "s16"),
    AudioFormat("mp3", "audio/mpeg", "mp3", "libmp3lame", None),
    AudioFormat("opus", "audio/ogg", "ogg", "libopus", None),  # Ogg Opus, as OpenAI's
    AudioFormat("aac", "audio/aac", "adts", "aac", None),  # ADTS frames: playable from any byte on
)
FORMATS: dict[str, AudioFormat] = {fmt.name: fmt for fmt in map(_with_encoder_rates, _CANDIDATES) if fmt}
UNSUPPORTED = tuple(fmt.name for fmt in _CANDIDATES if fmt.name not in FORMATS)  # no encoder in this build


class SpecError(ValueError):
    """A sample rate or channel count this format cannot carry; `param` names the request field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class OutputSpec:
    format: AudioFormat
    sample_rate: int = OPENAI_SAMPLE_RATE
    channels: int = OPENAI_CHANNELS

    @classmethod
    def of(cls, name: str, sample_rate: Optional[int] = None, channels: Optional[int] = None) -> "OutputSpec":
        """The spec a request asks for (None = OpenAI's default); SpecError names what to fix."""
        fmt = FORMATS[name]
        rate = OPENAI_SAMPLE_RATE if sample_rate is None else sample_rate
        if rate not in fmt.sample_rates:
            raise SpecError("sample_rate", f"{fmt.name} carries {_listed(fmt.sample_rates)} Hz, not {rate}; leave "
                            f"sample_rate out for {OPENAI_SAMPLE_RATE} (OpenAI's), or 48000 for the server's own rate")
        count = OPENAI_CHANNELS if channels is None else channels
        if count not in CHANNEL_COUNTS:
            raise SpecError("channels", f"channels must be 1 (mono, OpenAI's) or 2 (the server's stereo), not {count}")
        return cls(fmt, rate, count)

    @property
    def is_native(self) -> bool:
        """The server's own stream: nothing to resample or downmix."""
        return (self.sample_rate, self.channels) == (SAMPLE_RATE, CHANNELS)

    @property
    def samples_per_frame(self) -> int:
        """Samples per channel of one 80 ms frame at this rate (a whole number for SAMPLE_RATES)."""
        return SAMPLES_PER_FRAME * self.sample_rate // SAMPLE_RATE

    def headers(self) -> dict[str, str]:
        headers = {"X-Sample-Rate": str(self.sample_rate), "X-Channels": str(self.channels)}
        if self.format.sample_format:
            headers["X-Sample-Format"] = self.format.sample_format
        return headers


def _listed(values: tuple[int, ...]) -> str:
    return ", ".join(map(str, values[:-1])) + f" or {values[-1]}" if len(values) > 1 else str(values[0])
