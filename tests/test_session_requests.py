"""The requests of a text session as both clients send them (moss_tts.session_requests)."""

from __future__ import annotations

from moss_tts.contract import tensors as contract
from moss_tts.contract.session_requests import SessionRequests


def test_the_voice_goes_with_the_first_request_only_and_the_close_carries_no_options():
    plan = SessionRequests({"reference_audio": b"RIFF", "mode": "clone", "seed": 7, "TOP_P": 0.9}, id_prefix="s:")
    first, second = plan.next("Hello there."), plan.next("How are you?")
    assert first == ("s:0", {"reference_audio": b"RIFF", "mode": "clone", "seed": 7, "TOP_P": 0.9,
                             "SESSION_INDEX": 0})
    assert second == ("s:1", {"seed": 7, "TOP_P": 0.9, "SESSION_INDEX": 1})
    assert plan.end_id is None
    assert plan.next("", is_end=True) == ("s:end", {"SESSION_INDEX": 2})
    assert plan.end_id == "s:end" and plan.segments == ["Hello there.", "How are you?"]
    assert [plan.segment_of(i) for i in ("s:0", "s:1", "s:end")] == [0, 1, None]


def test_the_last_segment_can_carry_the_end_itself():
    plan = SessionRequests({"REFERENCE_CODES": [[1] * 12], "SEED": 1})
    assert plan.next("Only this.", is_end=True) == ("0", {"REFERENCE_CODES": [[1] * 12], "SEED": 1,
                                                           "SESSION_INDEX": 0})
    assert plan.end_id == "0" and plan.segment_of("0") == 0


def test_the_voice_inputs_are_moss_tts_inputs():
    names = {t.name for t in contract.MOSS_TTS_INPUTS}
    assert set(contract.SESSION_VOICE_INPUTS) <= names
