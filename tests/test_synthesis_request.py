"""Triton input parsing of the moss_tts model (no Triton needed)."""

from __future__ import annotations

import numpy as np
import pytest

from moss_tts.contract.errors import InvalidRequest
from moss_tts.pipeline.synthesis_request import parse_synthesis_request


def parse(**inputs):
    arrays = {k: np.array([v], dtype=object if isinstance(v, (bytes, str)) else None) for k, v in inputs.items()}
    return parse_synthesis_request(arrays.get, "default-id")


def test_defaults_and_values():
    req = parse(TEXT=b"${token:40}Hello", LANGUAGE=b"auto", SEED=5, TOP_K=10, STREAM=False, MODE=b"voice_clone")
    assert req.text == "Hello" and req.fields.tokens == 40 and req.fields.language is None
    assert req.params.seed == 5 and req.params.audio.top_k == 10 and req.params.audio.temperature == 1.7
    assert req.stream is False and req.mode == "clone" and req.request_id == "default-id"
    assert parse(TEXT=b"x", TOKENS=12).fields.tokens == 12  # explicit TOKENS wins over no prefix
    assert parse(TEXT=b"x", REQUEST_ID=b" mine ").request_id == "mine"


@pytest.mark.parametrize("inputs, message", [
    (dict(), "TEXT is required"),
    (dict(TEXT=b""), "TEXT is empty"),
    (dict(TEXT=b"\xff"), "not valid UTF-8"),
    (dict(TEXT=b"hi", TEMPERATURE=float("inf")), "finite number"),
    (dict(TEXT=b"hi", TOP_K=2.5), "must be an integer"),
    (dict(TEXT=b"hi", TOP_P=b"0.5"), "must be numeric"),
    (dict(TEXT=b"hi", CHUNK_FRAMES=999), r"CHUNK_FRAMES must be in \[1, 250\]"),
    (dict(TEXT=b"hi", MODE=b"shout"), "MODE must be one of"),
    (dict(TEXT=b"hi", STOP_TOP_P=2.0), "stop top_p"),
])
def test_rejections_name_the_input(inputs, message):
    with pytest.raises(InvalidRequest, match=message):
        parse(**inputs)


def test_multi_element_input_is_rejected():
    with pytest.raises(InvalidRequest, match="exactly one value"):
        parse_synthesis_request({"TEXT": np.array([b"a", b"b"], dtype=object)}.get, "id")
