"""The moss_tts entry's request policy without Triton: SpeechRequests (a request's reference and
kind) and SessionAdmission (a text session's request checked, joined, relayed or refused), with
fake engine codes, children and clients."""

from __future__ import annotations

import numpy as np
import pytest

from moss_tts.contract.errors import ErrorKind, InvalidRequest
from moss_tts.pipeline.speech_requests import SpeechRequests, requested_outputs
from moss_tts.pipeline.speech_stream import SpeechStream
from moss_tts.pipeline.synthesis_request import parse_session_inputs
from moss_tts.sessions.admission import SessionAdmission
from moss_tts.sessions.claims import SessionClaims, SessionHeldElsewhere
from moss_tts.sessions.registry import SessionConfig, SessionRegistry
from moss_tts.sessions.relay import RelayedStream
from moss_tts.sessions.session_request import SessionRequest
from test_speech_pipeline import FakeClient


def inputs(**values):
    arrays = {k: np.array([v], dtype=object if isinstance(v, (str, bytes)) else None) for k, v in values.items()}
    return lambda name: arrays.get(name)


class FakeCodes:
    """What codes_for returns, as far as the admission looks at it."""

    def __init__(self, synthesis, reference):
        self.synthesis, self.reference = synthesis, reference


class FakeChildren:
    def __init__(self, codes):
        self.codes, self.sequence_id = codes, 7


class FakePool:
    def __init__(self, accepts=True):
        self.accepts, self.started = accepts, []

    def try_start(self, run):
        self.started.append(run)
        return self.accepts

    def is_stopping(self):
        return False

    def refusal(self):
        return "server is busy: 1 streams; retry later"


def speech_requests(encoded=None):
    encoded = [] if encoded is None else encoded
    requests = SpeechRequests(None, None, FakeChildren, lambda audio: encoded.append(audio) or "codes",
                              lambda record: None, lambda: False)
    requests.codes = FakeCodes  # codes_for needs an engine: the admission only hands its result on
    return requests


def admission(tmp_path=None, instance="moss_tts_0_0", pool=None, **config):
    ids = iter(range(100, 1000))
    claims = SessionClaims(tmp_path / "claims", instance) if tmp_path is not None else None
    sessions = SessionRegistry(SessionConfig(**config), lambda _: None, lambda: next(ids), claims=claims)
    return SessionAdmission(speech_requests(), sessions, pool or FakePool())


def prepare(door, values, requested=("AUDIO",), may_relay=True, admitted=None):
    get = inputs(**values)
    return door.prepare(get, parse_session_inputs(get), 0.0, set(requested), "r1", FakeClient(),
                        on_admit=lambda: (admitted if admitted is not None else []).append(True), may_relay=may_relay)


def test_a_request_gets_a_unique_engine_id_and_its_reference_as_a_callable():
    encoded = []
    requests = speech_requests(encoded)
    synthesis = requests.synthesis("7", inputs(TEXT="Hello."))
    assert synthesis.request_id.startswith("7-")
    assert synthesis.request_id != requests.synthesis("7", inputs(TEXT="Hi.")).request_id  # clients repeat ids
    reference = requests.reference(inputs(TEXT="Hello.", REFERENCE_AUDIO=b"RIFF"), synthesis)
    assert not encoded and reference() == "codes" and encoded == [b"RIFF"]  # encoded on the stream thread
    assert requests.reference(inputs(TEXT="Hello."), synthesis)() is None
    with pytest.raises(InvalidRequest, match="not both"):
        requests.reference(inputs(TEXT="Hi.", REFERENCE_AUDIO=b"RIFF", REFERENCE_CODES=np.zeros((1, 12))), synthesis)
    continuation = requests.synthesis("1", inputs(TEXT="Hello.", MODE="continuation"))
    with pytest.raises(InvalidRequest, match="MODE=continuation needs REFERENCE_AUDIO"):
        requests.reference(inputs(TEXT="Hello.", MODE="continuation"), continuation)
    assert requested_outputs([]) == {"AUDIO", "CODES", "CONTEXT_CODES"} and requested_outputs(["CODES"]) == {"CODES"}


@pytest.mark.parametrize("values, requested, path", [
    (dict(TEXT="Hello."), ("AUDIO",), "stream"),
    (dict(TEXT="Hello.", STREAM=False), ("AUDIO",), "offline"),
    (dict(TEXT="Hello."), ("CODES",), "codes"),
])
def test_a_request_outside_sessions_is_one_speech_stream_of_its_kind(values, requested, path):
    stream, kind = speech_requests().stream(inputs(**values), "r", set(requested), FakeClient(), 0.0)
    assert isinstance(stream, SpeechStream) and kind == path
    assert stream.wants_audio == ("AUDIO" in requested) and stream.stream == values.get("STREAM", True)


@pytest.mark.parametrize("values, requested, message", [
    (dict(TEXT="Hi.", SESSION_ID="s"), ("CODES",), "request AUDIO"),
    (dict(TEXT="Hi.", SESSION_ID="s", STREAM=False), ("AUDIO",), "drop STREAM=false and TOKENS"),
    (dict(TEXT="Hi.", SESSION_ID="s", TOKENS=20), ("AUDIO",), "drop STREAM=false and TOKENS"),
    (dict(TEXT="Hi.", SESSION_ID="s", SESSION_INDEX=1, MODE="clone"), ("AUDIO",), "MODE: the voice of text session"),
])
def test_a_session_request_that_cannot_be_served_is_refused_before_it_joins(values, requested, message):
    door = admission()
    with pytest.raises(InvalidRequest, match=message):
        prepare(door, values, requested)
    assert door.sessions.stats().opened == 0


def test_the_first_request_opens_the_session_on_its_sequence_and_later_ones_clone_its_voice():
    door, admitted = admission(), []
    first = prepare(door, dict(TEXT="One.", SESSION_ID="s", REFERENCE_CODES=np.zeros((1, 3, 12))), admitted=admitted)
    assert isinstance(first, SessionRequest) and first.ticket == 0 and admitted == [True]
    assert first.stream.children.inner.sequence_id == first.session.sequence_id  # the session's one sequence
    later = prepare(door, dict(TEXT="Two.", SESSION_ID="s"))
    assert later.ticket == 1 and later.session is first.session
    # One listener: the requests' chunks are due by the session's clock (pipeline/playback.py).
    assert first.stream.playback is later.stream.playback is first.session.playback
    codes = later.stream.children.inner.codes.inner  # SessionCodes around what codes_for made
    assert codes.synthesis.mode == "clone" and codes.reference == first.session.voice_codes
    with pytest.raises(InvalidRequest, match="REFERENCE_AUDIO: the voice of text session 's' is set by its first"):
        prepare(door, dict(TEXT="Three.", SESSION_ID="s", REFERENCE_AUDIO=b"RIFF"))
    assert prepare(door, dict(TEXT="", SESSION_ID="s", SESSION_END=True)).stream is None  # an END alone speaks nothing


def test_a_session_another_instance_holds_is_relayed_there_once(tmp_path):
    holder, other = admission(tmp_path, "moss_tts_0_0"), admission(tmp_path, "moss_tts_0_1")
    prepare(holder, dict(TEXT="One.", SESSION_ID="s"))
    admitted = []
    relayed = prepare(other, dict(TEXT="Two.", SESSION_ID="s", SESSION_INDEX=1), admitted=admitted)
    assert isinstance(relayed, RelayedStream) and admitted == [True] and other.sessions.stats().opened == 0
    assert relayed.message["inputs"]["SESSION_ID"] and relayed.path.name == "moss_tts_0_0.sock"
    with pytest.raises(SessionHeldElsewhere) as refused:  # a relayed request is never relayed again
        prepare(other, dict(TEXT="Two.", SESSION_ID="s", SESSION_INDEX=1), may_relay=False)
    assert refused.value.kind is ErrorKind.UNAVAILABLE
    holder.sessions.stop()
    other.sessions.stop()


def test_a_refused_start_closes_the_session_and_a_relayed_request_is_told():
    pool = FakePool(accepts=False)
    door = admission(pool=pool)
    request = prepare(door, dict(TEXT="One.", SESSION_ID="s"))
    assert not door.start(request) and door.sessions.stats().failed == 1 and not door.sessions.is_open("s")
    client = FakeClient()
    door.accept_relayed({"inputs": {}, "requested": [], "request_id": "x"}, client)
    assert client.errors == [(ErrorKind.INVALID_ARGUMENT, "a relayed request must name a SESSION_ID")]
