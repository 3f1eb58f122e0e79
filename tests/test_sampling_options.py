"""A sampling option is declared once (moss_tts/contract/sampling_options.py): name, type, default
on each channel, range. Everything else follows from the declaration, for every option there is:
the moss_tts and moss_tts_codes inputs, the generated configs, a request's parsing and checks,
the per-row tensors and the engine's slot rows (issue 33)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import ROOT
from moss_tts.contract import tensors as contract
from moss_tts.contract.sampling_options import CHANNELS, SAMPLING_OPTIONS
from moss_tts.contract.sampling_params import ChannelParams, SamplingError, SamplingParams, channel_defaults
from moss_tts.engine.slot_state import FLOAT_PARAMS, INT_PARAMS, SlotState, param_rows
from moss_tts.model.sampler import ChannelTensors
from moss_tts.pipeline.synthesis_request import parse_synthesis_request
from moss_tts.tools import contract_configs

CHANNEL_INPUTS = [(o, channel) for channel in CHANNELS for o in SAMPLING_OPTIONS if o.has_input(channel)]


def other_value(option, channel):
    """A value the option allows that is not its default on `channel`."""
    default = option.default(channel)
    for value in (default + 1, default / 2, 0.5, 1, 0):
        value = option.kind(value)
        if value != default and option.problem(value) is None:
            return value
    raise AssertionError(f"no test value for {option.name}")


def inputs(**values):
    arrays = {name: np.array([value]) for name, value in values.items()}
    return lambda name: arrays.get(name)


def test_the_configs_are_generated_from_the_contract():
    stale = [str(p.relative_to(ROOT)) for p, text in contract_configs.expected_files(ROOT / "model_repository").items()
             if p.read_text() != text]
    assert not stale, f"regenerate with `python -m moss_tts.tools.contract_configs`: {stale}"
    assert contract_configs.main(["--repository", str(ROOT / "model_repository"), "--check"]) == 0


@pytest.mark.parametrize("option, channel", CHANNEL_INPUTS, ids=lambda x: getattr(x, "name", x))
def test_an_option_is_an_input_of_both_entries_with_its_type(option, channel):
    name = option.input_name(channel)
    for entry in (contract.MOSS_TTS_INPUTS, contract.MOSS_TTS_CODES_INPUTS):
        assert {t.name: (t.dtype, t.dims, t.optional) for t in entry}[name] == (option.dtype, (1,), True)


@pytest.mark.parametrize("option, channel", CHANNEL_INPUTS, ids=lambda x: getattr(x, "name", x))
def test_a_request_sets_an_option_from_its_input_and_refuses_it_out_of_range(option, channel):
    value = other_value(option, channel)
    params = parse_synthesis_request(inputs(TEXT="Hi.", **{option.input_name(channel): value}), "r").params
    assert getattr(getattr(params, channel), option.name) == value
    assert getattr(getattr(params, "stop" if channel == "audio" else "audio"), option.name) == option.default(
        "stop" if channel == "audio" else "audio")
    with pytest.raises(SamplingError, match=f"{channel} {option.name} must be"):
        SamplingParams(**{channel: ChannelParams(**{**vars(channel_defaults(channel)),
                                                    option.name: option.kind(option.low - 1)})})


def test_every_option_reaches_the_per_row_tensors_and_the_slot_rows():
    assert [f for f in ChannelTensors.__dataclass_fields__] == [o.name for o in SAMPLING_OPTIONS]
    assert len(FLOAT_PARAMS) + len(INT_PARAMS) == 2 * len(SAMPLING_OPTIONS) + 3  # + seed, max_frames, ignore_stop
    channels = {channel: ChannelParams(
        **{o.name: other_value(o, channel) if o.has_input(channel) else o.default(channel) for o in SAMPLING_OPTIONS})
        for channel in CHANNELS}
    params = SamplingParams(**channels, seed=5, max_frames=9, ignore_stop=True)
    state = SlotState.allocate(3, SimpleNamespace(n_vq=2, audio_vocab_size=8), "cpu")
    floats, ints = param_rows(params)
    state.assign(torch.tensor([2]), torch.tensor([floats], dtype=torch.float32), torch.tensor([ints]))
    for channel in CHANNELS:
        for o in SAMPLING_OPTIONS:
            row = getattr(getattr(state.sampling, channel), o.name)[2].item()
            assert row == pytest.approx(getattr(getattr(params, channel), o.name)), (channel, o.name)
    assert (state.sampling.seed[2].item(), state.max_frames[2].item(), state.ignore_stop[2].item()) == (
        params.row_seed, 9, True)
