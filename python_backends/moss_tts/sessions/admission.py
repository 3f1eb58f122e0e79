"""SessionAdmission: how `moss_tts` admits one request of a text session (docs/structure.md, "Text
sessions"), and how it starts any stream on its pool. No Triton import.

A session request is refused at once (InvalidRequest) when it does not ask for AUDIO, has
STREAM=false or TOKENS, or carries voice inputs after the session's first request; the registry
refuses a closed or unknown session, a repeated SESSION_INDEX, and UNAVAILABLE beyond
max_sessions. An admitted request gets a ticket (its place) and runs on a stream thread like any
request; its codes carry the session's voice, its vocoder calls the session's one sequence
(session_request.py). A request for a session that another instance of this server holds is
relayed there (relay.py), once: a relayed request is never relayed again.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Union

from ..contract.errors import ErrorKind, InvalidRequest, ServingError
from ..contract.tensors import MOSS_TTS_INPUTS, SESSION_VOICE_INPUTS
from ..pipeline.speech_requests import SpeechRequests, requested_outputs
from ..pipeline.speech_stream import SpeechStream
from ..pipeline.stream_ports import Client
from ..pipeline.synthesis_request import Getter, SessionInputs, parse_session_inputs
from .claims import SessionHeldElsewhere, server_directory
from .registry import SessionRegistry
from .relay import RelayedStream, message_getter, request_message, socket_path
from .session_request import SessionChildren, SessionClient, SessionCodes, SessionRequest, first_reference

JOIN_TRIES = 50  # reads of a claim whose holder has not written its name yet, 10 ms apart


class SessionAdmission:
    def __init__(self, requests: SpeechRequests, sessions: SessionRegistry, pool) -> None:
        self.requests = requests
        self.sessions = sessions
        self.pool = pool  # serving.stream_pool.StreamPool

    def prepare(self, get: Getter, inputs: SessionInputs, started: float, requested: set, request_id: str,
                client: Client, on_admit: Callable[[], None], may_relay: bool) -> Union[SessionRequest, RelayedStream]:
        """One request of a text session, checked here, to run in order. `client`: the request's
        own, or a RelayClient when it came from another instance; a request for a session another
        instance holds is relayed there if `may_relay`. `on_admit` runs once it is accepted."""
        synthesis = self.requests.synthesis(request_id, get) if inputs.has_text else None
        if "AUDIO" not in requested:
            raise InvalidRequest("a text session streams audio: request AUDIO (CODES may come with it)")
        if synthesis is not None and (not synthesis.stream or synthesis.fields.tokens is not None):
            raise InvalidRequest("a text session streams each segment: drop STREAM=false and TOKENS")
        voice_inputs = [name for name in SESSION_VOICE_INPUTS if get(name) is not None]
        is_later = inputs.index != 0 if inputs.index is not None else self.sessions.is_open(inputs.session_id)
        if voice_inputs and is_later:
            raise InvalidRequest(f"{', '.join(voice_inputs)}: the voice of text session {inputs.session_id!r} is "
                                 f"set by its first request; send these only there")
        reference = self.requests.reference(get, synthesis) if synthesis is not None else (lambda: None)
        try:
            session, ticket, _ = self._join(inputs)
        except SessionHeldElsewhere as held:
            if not may_relay or not held.owner:  # relayed once already; or its holder never said
                raise
            on_admit()
            self.sessions.count_relayed()
            inputs_sent = {t.name: value for t in MOSS_TTS_INPUTS if (value := get(t.name)) is not None}
            message = request_message(inputs_sent, sorted(requested), request_id or "")
            return RelayedStream(socket_path(server_directory(), held.owner), message, client, self.pool.is_stopping)
        try:
            on_admit()
            return self._session_request(client, synthesis, reference, inputs, session, ticket, started)
        except BaseException:  # the ticket must be given back, or the session's later requests wait forever
            self.sessions.finish(session, "failed")
            raise

    def accept_relayed(self, message: dict, client) -> None:
        """A session request relayed from another instance of this server (relay.RelayServer)."""
        started = time.monotonic()
        try:
            get = message_getter(message)
            inputs = parse_session_inputs(get)
            if inputs is None:
                raise InvalidRequest("a relayed request must name a SESSION_ID")
            stream = self.prepare(get, inputs, started, requested_outputs(message["requested"]),
                                  message["request_id"], client, on_admit=lambda: None, may_relay=False)
        except ServingError as exc:
            client.send_error(str(exc), exc.kind)
            return
        if not self.start(stream):
            client.send_error(self.pool.refusal(), ErrorKind.UNAVAILABLE)

    def start(self, stream) -> bool:
        """Run any moss_tts stream on a thread of the pool; False when the pool refuses it (a session
        request's turn then never comes: its session closes)."""
        if self.pool.try_start(stream.run):
            return True
        if isinstance(stream, SessionRequest):
            self.sessions.finish(stream.session, "failed")
        return False

    def _join(self, inputs: SessionInputs):
        """sessions.join; a claim whose holder has not written its name yet (it opens the session
        this moment) is read again for a short while."""
        for _ in range(JOIN_TRIES):
            try:
                return self.sessions.join(inputs.session_id, inputs.is_end, inputs.has_text, inputs.index)
            except SessionHeldElsewhere as held:
                if held.owner:
                    raise
                time.sleep(0.01)
        return self.sessions.join(inputs.session_id, inputs.is_end, inputs.has_text, inputs.index)

    def _session_request(self, base_client, synthesis, reference, inputs, session, ticket, started) -> SessionRequest:
        on_final = (lambda: self.sessions.close(session, "ended")) if inputs.is_end else (lambda: None)
        recording = self.requests.record(base_client, started, ticket)
        client = SessionClient(recording, on_final)
        stream = None
        is_first = ticket == 0  # the session's first request: its reference, or its first frames, is the voice
        if synthesis is not None:
            if is_first:
                codes = self.requests.codes(synthesis, first_reference(session, reference))
            else:
                codes = self.requests.codes(replace(synthesis, mode="clone"), session.voice_codes)
            children = self.requests.children(SessionCodes(codes, session, is_first))
            children.sequence_id = session.sequence_id
            stream = SpeechStream(SessionChildren(children, session, inputs.is_end, client), client, True, True,
                                  self.pool.is_stopping, recording.trace, session.playback)
        return SessionRequest(self.sessions, session, ticket, stream, client, self.pool.is_stopping)
