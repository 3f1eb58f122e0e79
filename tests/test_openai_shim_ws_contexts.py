"""Several contexts on one WebSocket, and timestamps (issue 32; docs/websocket.md, "Contexts" and
"Timestamps"): the `websockets` client -> the `openai_shim` fixture (--ws-max-contexts 3,
--ws-idle-timeout 3) -> the real tritonserver (tiny checkpoint, CPU). SSE's timestamps through the
official `openai` SDK."""

from __future__ import annotations

import base64
import json
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from test_openai_shim import MODEL, fixed, iter_sse, sdk
from test_openai_shim_ws import FRAMES, LONG, NATIVE, OPTIONS, assert_cancelled_and_free, send, start, ws_url
from test_text_session_triton import TEXT, all_free

pytestmark = pytest.mark.triton

FRAME_S = 0.08
OPENAI_RATE = 24000  # the default pcm: 24 kHz mono s16le
SHORT = {k: v for k, v in OPTIONS.items() if k not in NATIVE}  # the socket's format: OpenAI's pcm


class Transcript:
    """Everything one socket received, in order: JSON events and audio per context (None = the
    default context's binary frames)."""

    def __init__(self, ws):
        self.ws = ws
        self.messages: list[tuple[str, object, object]] = []  # (kind, context, event or bytes)
        self.is_closed = False

    def read(self, until, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not until(self):
            assert time.monotonic() < deadline, self.events()
            try:
                message = self.ws.recv(timeout=timeout)
            except ConnectionClosed:
                self.is_closed = True
                return
            if isinstance(message, bytes):
                self.messages.append(("audio", None, message))
                continue
            event = json.loads(message)
            if event["type"] == "audio":
                self.messages.append(("audio", event["context_id"], base64.b64decode(event["audio"])))
            else:
                self.messages.append(("event", event.get("context_id"), event))

    def events(self, context="any", type=None) -> list[dict]:
        return [m for kind, c, m in self.messages if kind == "event" and context in ("any", c)
                and (type is None or m["type"] == type)]

    def audio(self, context) -> bytes:
        return b"".join(m for kind, c, m in self.messages if kind == "audio" and c == context)

    def done(self, context):
        found = self.events(context, "done")
        return found[0] if found else None

    def error(self, context) -> dict:
        """The next error event naming `context`."""
        seen = len(self.events(context, "error"))
        self.read(lambda t: len(t.events(context, "error")) > seen)
        assert not self.is_closed, (self.ws.close_code, self.ws.close_reason, self.events()[-3:])
        return self.events(context, "error")[-1]


def has(type, context):
    return lambda t: bool(t.events(context, type))


def open_socket(ws, **options) -> Transcript:
    """A socket idle for 20 s at most: the fixture's 3 s would race a loaded machine's first audio."""
    start(ws, **{"inactivity_timeout": 20, **options})
    return Transcript(ws)


def assert_whole(transcript: Transcript, context, rate: int, channels: int) -> None:
    """The context's audio is all its frames, and its segments tile it: each starts where the one
    before ended, the last ends at done.frames x 80 ms = the audio's length."""
    done = transcript.done(context)
    segments = transcript.events(context, "segment.done")
    audio = transcript.audio(context)
    assert done is not None and "cancelled" not in done and done["segments"] == len(segments) > 0, done
    assert len(audio) == done["frames"] * (rate * 80 // 1000) * channels * 2
    assert segments[0]["start_s"] == 0.0
    for before, after in zip(segments, segments[1:]):
        assert before["end_s"] == after["start_s"]
    for segment in segments:
        assert segment["end_s"] - segment["start_s"] == pytest.approx(segment["frames"] * FRAME_S)
    assert segments[-1]["end_s"] == pytest.approx(done["frames"] * FRAME_S)
    assert segments[-1]["end_s"] == pytest.approx(len(audio) / (rate * channels * 2))


# --- two contexts at once ------------------------------------------------------------------------

def test_two_contexts_at_once_and_cancelling_one_leaves_the_other_whole(openai_shim, triton):
    before = triton.settled_metrics()
    with connect(ws_url(openai_shim)) as ws:
        t = open_socket(ws, **SHORT)
        send(ws, type="options", context_id="long", **{k: v for k, v in LONG.items() if k not in NATIVE})
        send(ws, type="text", context_id="long", text="A long first sentence. And a second one ")
        t.read(lambda t: t.audio("long"))
        assert [e["type"] for e in t.events("long")] == ["context.started"]
        send(ws, type="text", context_id="b", text="First sentence here. Second one ")  # the socket's options
        send(ws, type="text", context_id="b", text="follows.")
        send(ws, type="end", context_id="b")
        t.read(lambda t: t.audio("b"))
        send(ws, type="cancel", context_id="long")
        t.read(lambda t: t.done("long") and t.done("b"))
        assert t.done("long")["cancelled"] is True and t.done("long")["segments"] >= 1
        send(ws, type="close_socket")
        t.read(lambda t: t.is_closed)
        assert (ws.close_code, ws.close_reason) == (1000, "close_socket")
    kinds = [(kind, c, m["type"] if kind == "event" else None) for kind, c, m in t.messages]
    assert kinds.index(("event", "b", "context.started")) < kinds.index(("audio", "b", None))
    assert ("audio", "long", None) not in kinds[kinds.index(("event", "long", "done")):]  # none after its done
    assert not t.audio(None) and t.events("b", "error") == []
    assert [s["text"] for s in t.events("b", "segment.done")] == ["First sentence here.", "Second one follows."]
    assert t.done("b")["frames"] == 2 * FRAMES
    assert_whole(t, "b", OPENAI_RATE, 1)  # converted to 24 kHz mono: the resampler's tail included
    assert_cancelled_and_free(triton, before)


def test_timestamps_add_up_for_a_named_and_the_default_context(openai_shim, triton):
    """The named context first (the default context's done closes the socket), then the default."""
    with connect(ws_url(openai_shim)) as ws:
        t = open_socket(ws, **OPTIONS)  # the server's own 48 kHz stereo
        send(ws, type="text", context_id="n", text=TEXT)
        send(ws, type="end", context_id="n")
        t.read(lambda t: t.done("n"))
        send(ws, type="text", text=TEXT)
        send(ws, type="end")
        t.read(lambda t: t.is_closed)
        assert (ws.close_code, ws.close_reason) == (1000, "done")
    for context in ("n", None):
        assert len(t.events(context, "segment.done")) == 3
        assert_whole(t, context, 48000, 2)
    assert t.events("n", "segment.done") == [dict(e, context_id="n") for e in t.events(None, "segment.done")]
    all_free(triton)


def test_sse_done_says_where_the_audio_ends(openai_shim):
    with sdk(openai_shim.url).audio.speech.with_streaming_response.create(
            model=MODEL, voice="default", input="Hello world.", response_format="pcm", stream_format="sse",
            extra_body=fixed(7, native=False)) as response:
        events = list(iter_sse(response))
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["usage"]["output_tokens"] == 7
    assert done["segments"] == [{"index": 0, "start_s": 0.0, "end_s": pytest.approx(7 * FRAME_S)}]
    assert done["segments"][0]["end_s"] == pytest.approx(len(audio) / (OPENAI_RATE * 2))


# --- bad input: an error event naming the context, the others go on ------------------------------

def witness(ws, t: Transcript, context="w") -> None:
    """A context that is speaking while the bad message comes."""
    send(ws, type="text", context_id=context, text="A witness speaks here. And on ")
    t.read(lambda t: t.audio(context))


def assert_witness_whole(ws, t: Transcript, context="w") -> None:
    send(ws, type="end", context_id=context)
    t.read(lambda t: t.done(context) or t.is_closed)
    assert not t.is_closed
    assert_whole(t, context, 48000, 2)


ENDED = [{"type": "text", "context_id": "old", "text": "Over soon."}, {"type": "end", "context_id": "old"}]
REFUSED = [  # (messages before, the message, the context its error event names, code)
    *[([], {"type": "text", "context_id": bad, "text": "Hi."}, bad, "invalid_context_id")
      for bad in ("", "has space", "x" * 65, 7, None, ["a"])],
    *[([], {"type": kind, "context_id": "nobody"}, "nobody", "unknown_context") for kind in ("flush", "end", "cancel")],
    ([], {"type": "options", "context_id": "w", **OPTIONS}, "w", "context_exists"),  # a duplicate open
    *[(ENDED, {"type": kind, "context_id": "old", "text": "Again."}, "old", "context_ended")
      for kind in ("cancel", "text", "end", "options")],
]


@pytest.mark.parametrize("before, message, context, code", REFUSED)
def test_a_bad_context_message_is_an_error_event_naming_it_and_the_others_go_on(openai_shim, triton, before,
                                                                                 message, context, code):
    with connect(ws_url(openai_shim)) as ws:
        t = open_socket(ws, **OPTIONS)
        for earlier in before:  # a context that has ended
            ws.send(json.dumps(earlier))
        if before:
            t.read(has("done", "old"))
        witness(ws, t)
        ws.send(json.dumps(message))
        error = t.error(context)
        assert error["error"]["code"] == code and error["status"] == 400, error
        assert_witness_whole(ws, t)
    all_free(triton)


def test_more_contexts_than_the_limit_is_an_error_event_and_the_default_counts(openai_shim, triton):
    with connect(ws_url(openai_shim)) as ws:
        t = open_socket(ws, **OPTIONS)
        witness(ws, t)
        send(ws, type="options", context_id="b", **OPTIONS)
        send(ws, type="text", text="The default context counts too.")
        send(ws, type="text", context_id="c", text="One too many.")
        error = t.error("c")
        assert error["error"]["code"] == "too_many_contexts" and "3 contexts" in error["error"]["message"], error
        send(ws, type="cancel", context_id="b")  # one frees its place
        t.read(has("done", "b"))
        send(ws, type="text", context_id="c", text="Now there is room.")
        send(ws, type="end", context_id="c")
        t.read(has("done", "c"))
        assert_witness_whole(ws, t)
        assert_whole(t, "c", 48000, 2)
    all_free(triton)


def test_a_context_cannot_change_the_socket_format_or_timeout(openai_shim, triton):
    with connect(ws_url(openai_shim)) as ws:
        t = open_socket(ws, **OPTIONS)
        witness(ws, t)
        for change in ({"sample_rate": 24000}, {"response_format": "wav"}, {"inactivity_timeout": 60}):  # socket's: 20
            send(ws, type="options", context_id="own", **{**OPTIONS, **change})
            error = t.error("own")
            assert error["error"]["code"] == "socket_option" and error["error"]["param"] == next(iter(change))
        send(ws, type="options", context_id="own", **{**OPTIONS, "seed": 9, "inactivity_timeout": 20})  # the same: ok
        t.read(has("context.started", "own"))
        assert_witness_whole(ws, t)
        send(ws, type="cancel", context_id="own")
        t.read(has("done", "own"))
    all_free(triton)


def test_a_context_failure_ends_that_context_only(openai_shim, triton):
    """The server refuses max_new_tokens 5000 for its max_seq_len at the first text (400)."""
    with connect(ws_url(openai_shim)) as ws:
        t = open_socket(ws, **OPTIONS)
        witness(ws, t)
        send(ws, type="options", context_id="bad", **{**OPTIONS, "max_new_tokens": 5000})
        send(ws, type="text", context_id="bad", text="Hello there.")
        send(ws, type="flush", context_id="bad")  # a sentence is cut once more text or a flush follows
        error = t.error("bad")
        assert error["status"] == 400 and "MAX_FRAMES 5000 does not fit" in error["error"]["message"], error
        send(ws, type="flush", context_id="bad")
        assert t.error("bad")["error"]["code"] == "context_ended"
        assert_witness_whole(ws, t)
    all_free(triton)


def test_inactivity_timeout_sets_the_sockets_idle_timeout(openai_shim, triton):
    with connect(ws_url(openai_shim)) as ws:
        send(ws, type="options", inactivity_timeout=5, **OPTIONS)
        assert Transcript(ws).error(None)["error"]["param"] == "inactivity_timeout"  # ElevenLabs' 20-180 s
        t = open_socket(ws, **OPTIONS)  # 20 s
        time.sleep(3.5)  # past the fixture's --ws-idle-timeout 3
        send(ws, type="text", context_id="late", text="Still here.")
        send(ws, type="end", context_id="late")
        t.read(has("done", "late"))
        assert_whole(t, "late", 48000, 2)
    all_free(triton)
