"""error_text: exceptions become client-visible text without Python object reprs.

`assert_no_object_repr` is the check the bad-input tests of every tier (test_audio, test_ref_cache,
test_triton_pipeline, test_openai_shim, test_openai_shim_ws) run on the error text a client gets."""

from __future__ import annotations

import io

import pytest
import soundfile as sf

from moss_tts.contract.errors import error_text


def assert_no_object_repr(message: str) -> None:
    """No `<x.Y object at 0x...>` nor `<function f at 0x...>` (a memory address, different on every
    run) in an error a client sees."""
    assert " at 0x" not in message, message


def soundfile_error() -> Exception:
    with pytest.raises(Exception) as info:
        sf.read(io.BytesIO(b"RIFF this is not audio"))
    assert "object at 0x" in str(info.value)  # the library's own text: what error_text must clean
    return info.value


def test_an_object_repr_becomes_its_type_name():
    assert error_text(soundfile_error()) == "Error opening BytesIO: Format not recognised."


def test_reprs_of_functions_and_nested_objects_lose_their_address():
    def helper():
        pass

    class Thing:
        def method(self):
            pass

    text = error_text(ValueError(f"{helper} refused {object()} via {Thing().method}"))
    assert_no_object_repr(text)
    assert text.startswith("function refused object via <bound method ")


def test_a_key_error_is_its_key_without_quotes():
    assert error_text(KeyError("sequence 3 has no codec state")) == "sequence 3 has no codec state"


def test_an_empty_message_is_the_type_name_and_with_type_names_it_first():
    assert error_text(RuntimeError()) == "RuntimeError"
    assert error_text(RuntimeError("  boom "), with_type=True) == "RuntimeError: boom"
    assert error_text(RuntimeError(""), with_type=True) == "RuntimeError"
