"""moss_tts.contract is the one written form of the Triton contract: every config.pbtxt, both
clients and the shim must agree with it (names, dtypes, shapes, optional, limits)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from moss_tts.contract import tensors as contract
from moss_tts.contract.errors import ErrorKind, classify

REPO = Path(__file__).resolve().parent.parent / "model_repository"


def pbtxt(model: str) -> mc.ModelConfig:
    return text_format.Parse((REPO / model / "config.pbtxt").read_text(), mc.ModelConfig())


def declared(tensors) -> dict:
    return {t.name: (mc.DataType.Name(t.data_type).removeprefix("TYPE_").replace("STRING", "BYTES"),
                     tuple(t.dims), getattr(t, "optional", False)) for t in tensors}


@pytest.mark.parametrize("model", sorted(contract.CONTRACTS))
def test_every_pbtxt_matches_the_contract(model):
    inputs, outputs = contract.CONTRACTS[model]
    config = pbtxt(model)
    assert declared(config.input) == {t.name: (t.dtype, t.dims, t.optional) for t in inputs}
    assert {k: v[:2] for k, v in declared(config.output).items()} == {t.name: (t.dtype, t.dims) for t in outputs}


def test_the_model_repository_holds_exactly_the_contracted_models():
    assert {p.parent.name for p in REPO.glob("*/config.pbtxt")} == set(contract.CONTRACTS)


def test_the_model_config_agrees_with_the_contract():
    from moss_tts.model.config import MossTTSConfig, real_model_config_dict

    cfg = MossTTSConfig.from_dict(real_model_config_dict())
    assert (cfg.n_vq, cfg.audio_vocab_size) == (contract.N_VQ, contract.CODEBOOK_SIZE)
    assert contract.SAMPLE_RATE / contract.FRAME_RATE == contract.SAMPLES_PER_FRAME


def test_both_clients_send_every_option_with_the_contract_dtype():
    from client import tts_client
    from client.openai_shim import triton_stream

    for name, spec in contract.INPUTS.items():
        if spec.dims != (1,):
            continue  # REFERENCE_CODES is built by the ensemble, not sent as an option
        value = {"BYTES": "x", "BOOL": True, "FP32": 0.5}.get(spec.dtype, 3)
        grpc_input = tts_client.option_input(name, value)
        assert (grpc_input.name(), grpc_input.datatype(), grpc_input.shape()) == (name, spec.dtype, [1])
        aio_input, = triton_stream.build_inputs({name: value})
        assert (aio_input.name(), aio_input.datatype(), aio_input.shape()) == (name, spec.dtype, [1])


def test_stop_head_options_reach_the_grpc_client():
    """They were missing from client.tts_client once (the copies had drifted)."""
    from client.tts_client import build_inputs

    names = [i.name() for i in build_inputs("Hi.", stop_temperature=0.5, stop_top_p=0.9, stop_top_k=5)]
    assert names == ["TEXT", "STOP_TEMPERATURE", "STOP_TOP_P", "STOP_TOP_K"]


@pytest.mark.parametrize("name, value", [("TOP_K", 2**32 + 5), ("TOP_K", -(2**31) - 1), ("SEED", 2**63),
                                         ("MAX_FRAMES", 1.5), ("TOKENS", True)])
def test_integers_that_do_not_fit_their_dtype_are_refused_not_wrapped(name, value):
    with pytest.raises(ValueError, match=name):
        contract.input_array(name, value)


def test_input_arrays_have_the_declared_dtype():
    assert contract.input_array("TEXT", "héllo").tolist() == ["héllo".encode()]
    assert contract.input_array("SEED", 2**63 - 1).dtype == np.int64
    assert contract.input_array("TOP_P", 0.5).dtype == np.float32
    with pytest.raises(ValueError, match="unknown input 'TOPP'"):
        contract.input_array("TOPP", 1)


@pytest.mark.parametrize("message, kind, text", [
    ("[INVALID_ARGUMENT] input TEXT is empty", ErrorKind.INVALID_ARGUMENT, "input TEXT is empty"),
    ("in ensemble 'moss_tts_codes', [UNAVAILABLE] server is busy", ErrorKind.UNAVAILABLE, "server is busy"),
    ("[INVALID_ARG] old tag", ErrorKind.INVALID_ARGUMENT, "old tag"),
    ("Stub process 'moss_tts_0_0' is not healthy.", ErrorKind.UNAVAILABLE, None),
    ("Exceeds maximum queue size", ErrorKind.UNAVAILABLE, None),
    # Triton core's own refusals of a request that does not match config.pbtxt: no tag of ours.
    ("[request id: <id_unknown>] unexpected shape for input 'TOP_P' for model 'moss_tts'. Expected [1], got [2]",
     ErrorKind.INVALID_ARGUMENT, None),
    ("[request id: 1] expected 1 inputs but got 0 inputs for model 'moss_tts'", ErrorKind.INVALID_ARGUMENT, None),
    ("[request id: <id_unknown>] inference input 'TOP_P' data-type is 'FP64', but model 'moss_tts' expects 'FP32'",
     ErrorKind.INVALID_ARGUMENT, None),
    ("Model vocoder - Error when running inference: Server not ready", ErrorKind.UNAVAILABLE, None),
    ("something odd happened", ErrorKind.INTERNAL, "something odd happened"),
])
def test_every_server_message_gets_a_kind(message, kind, text):
    got_kind, got_text = classify(message)
    assert got_kind is kind
    if text is not None:
        assert got_text == text


def test_tags_are_not_doubled():
    assert ErrorKind.UNAVAILABLE.tag("[INVALID_ARGUMENT] child said no") == "[UNAVAILABLE] child said no"
