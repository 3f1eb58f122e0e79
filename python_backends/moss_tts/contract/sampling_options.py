"""The sampling options, declared once: name, type, default on each channel, range.

Each option is a per-row parameter of both channels of a frame's draw: the audio codebooks (the
moss_tts input NAME) and the stop head (STOP_NAME, unless the stop head has no such input). What
follows from this tuple, with no list of its own to edit:
- `sampling_params.ChannelParams`: its fields, their checks and the channels' defaults;
- the moss_tts inputs (`tensors.MOSS_TTS_INPUTS`), so the moss_tts_codes inputs, and the
  config.pbtxt input blocks (`python -m moss_tts.tools.contract_configs` writes them);
- a request's parsing (`pipeline/synthesis_request.py`);
- the per-row tensors (`model/sampler.ChannelTensors`) and the engine's slot rows
  (`engine/slot_state.py`: FLOAT_PARAMS/INT_PARAMS, param_rows, assign).
Adding an option: declare it here, use it in the sampler, regenerate the configs.
No torch, no Triton: clients import it (through tensors.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

MAX_TEMPERATURE = 100.0
MAX_REPETITION_PENALTY = 100.0

# Sampling defaults (upstream README, SGLang-Omni): codebooks 1.7 / 0.8 / 25, stop head 1.0 / 1.0 / 50.
AUDIO_TEMPERATURE = 1.7
AUDIO_TOP_P = 0.8
AUDIO_TOP_K = 25
AUDIO_REPETITION_PENALTY = 1.0
STOP_TEMPERATURE = 1.0
STOP_TOP_P = 1.0
STOP_TOP_K = 50

CHANNELS = ("audio", "stop")  # the codebooks, the stop head: one ChannelParams each
Number = Union[float, int]


@dataclass(frozen=True)
class SamplingOption:
    name: str  # the field of ChannelParams / ChannelTensors; the input is NAME or STOP_NAME
    kind: type  # float (an FP32 input) or int (INT32)
    audio: Number  # default on the audio codebooks
    stop: Number  # default on the stop head
    low: Number
    high: Number = math.inf
    low_open: bool = False  # (low, high] instead of [low, high]
    says: str = ""  # the allowed values in words, where "in [low, high]" would not say them
    has_stop_input: bool = True  # False: the stop head always keeps its default (no STOP_ input)
    required: bool = False  # ChannelParams(...) must name it; else it defaults to `audio`

    @property
    def dtype(self) -> str:
        return "FP32" if self.kind is float else "INT32"

    def default(self, channel: str) -> Number:
        return getattr(self, channel)

    def has_input(self, channel: str) -> bool:
        return channel == "audio" or self.has_stop_input

    def input_name(self, channel: str) -> str:
        return self.name.upper() if channel == "audio" else f"STOP_{self.name.upper()}"

    def problem(self, value: Number) -> Optional[str]:
        """What the option allows, in words, when `value` is outside it (NaN is); else None."""
        above_low = self.low < value if self.low_open else self.low <= value
        if above_low and value <= self.high:
            return None
        return self.says or f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


SAMPLING_OPTIONS = (
    SamplingOption("temperature", float, AUDIO_TEMPERATURE, STOP_TEMPERATURE, 0.0, MAX_TEMPERATURE, required=True),
    SamplingOption("top_p", float, AUDIO_TOP_P, STOP_TOP_P, 0.0, 1.0, low_open=True, required=True),
    SamplingOption("top_k", int, AUDIO_TOP_K, STOP_TOP_K, -1, says="-1 (off), 0 (off) or positive", required=True),
    SamplingOption("repetition_penalty", float, AUDIO_REPETITION_PENALTY, 1.0, 0.0, MAX_REPETITION_PENALTY,
                   low_open=True, has_stop_input=False),
)


def sampling_inputs() -> list[tuple[str, str]]:
    """(input name, dtype) of every option on every channel: the audio ones, then the stop head's."""
    return [(o.input_name(channel), o.dtype) for channel in CHANNELS for o in SAMPLING_OPTIONS if o.has_input(channel)]
