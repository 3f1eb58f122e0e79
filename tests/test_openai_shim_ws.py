"""The shim's WebSocket (WS /v1/audio/speech/stream, docs/websocket.md) end to end: the `websockets`
client library -> the `openai_shim` fixture -> the real tritonserver (tiny checkpoint, CPU).

The fixture's shim closes a WebSocket after 3 s without a client message (--ws-idle-timeout 3)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from test_error_text import assert_no_object_repr
from test_openai_shim import data_uri, tone_wav
from test_text_session_triton import OPEN, STARTED, TEXT, all_free

pytestmark = pytest.mark.triton

SPF = 3840  # samples per frame per channel
FRAME_BYTES = SPF * 2 * 2  # s16le stereo
FRAMES = 6
NATIVE = {"sample_rate": 48000, "channels": 2}  # the server's own stream: FRAME_BYTES per frame, exactly
OPTIONS = {"seed": 5, "max_new_tokens": FRAMES, "ignore_stop": True, "initial_codec_chunk_frames": 2, **NATIVE}
LONG = {"seed": 1, "max_new_tokens": 1900, "ignore_stop": True, "initial_codec_chunk_frames": 1, **NATIVE}
CANCELLED = 'moss_tts_sessions{stat="cancelled"}'
OPENED = 'moss_tts_sessions{stat="opened"}'


def ws_url(shim) -> str:
    return shim.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def send(ws, **message) -> None:
    ws.send(json.dumps(message))


def event(ws, timeout: float = 60) -> dict:
    """The next JSON event (audio frames before it are skipped)."""
    while isinstance(message := ws.recv(timeout=timeout), bytes):
        pass
    return json.loads(message)


def start(ws, **options) -> dict:
    send(ws, type="options", **options)
    started = event(ws)
    assert started["type"] == "session.started", started
    return started


def read_all(ws):
    """(audio bytes, JSON events, time of the first audio) until the server closes the connection."""
    audio, events, first = bytearray(), [], None
    try:
        while True:
            message = ws.recv(timeout=120)
            if isinstance(message, bytes):
                first = first or time.monotonic()
                audio += message
            else:
                events.append(json.loads(message))
    except ConnectionClosed:
        pass
    return bytes(audio), events, first


def first_audio(ws) -> bytes:
    while not isinstance(message := ws.recv(timeout=60), bytes):
        pass
    return message


def test_words_with_delays_stream_audio_as_they_come(openai_shim, triton):
    before = triton.settled_metrics()
    words = TEXT.split(" ")
    sent = {}
    with connect(ws_url(openai_shim)) as ws:
        started = start(ws, **OPTIONS)
        assert (started["response_format"], started["sample_rate"], started["channels"]) == ("pcm", 48000, 2)

        def writer():
            for word in words[:-1]:
                send(ws, type="text", text=word + " ")
                time.sleep(0.25)
            send(ws, type="text", text=words[-1])
            sent["last"] = time.monotonic()
            send(ws, type="end")

        thread = threading.Thread(target=writer)
        thread.start()
        audio, events, first = read_all(ws)
        thread.join()
        assert ws.close_code == 1000
    segments = [e for e in events if e["type"] == "segment.done"]
    assert [s["text"] for s in segments] == ["Good morning to you all.",
                                             "The weather is fine today, and the sun is out.",
                                             "We will walk to the park after lunch."]
    assert [s["index"] for s in segments] == [0, 1, 2] and [s["frames"] for s in segments] == [FRAMES] * 3
    assert events[-1] == {"type": "done", "segments": 3, "frames": 3 * FRAMES}
    assert first is not None and first < sent["last"]  # the first sentence spoke while the rest was written
    assert len(audio) == sum(s["frames"] for s in segments) * FRAME_BYTES
    all_free(triton)
    after = triton.settled_metrics()
    assert after[STARTED] - before[STARTED] == 1  # one vocoder sequence for the whole session


def test_audio_frames_are_never_deflated(openai_shim):
    """The client offers permessage-deflate (websockets does by default, as browsers do); the shim
    declines it: PCM barely compresses, and compressing each frame held the event loop (issue 31)."""
    with connect(ws_url(openai_shim)) as ws:
        assert "permessage-deflate" in ws.request.headers.get("Sec-WebSocket-Extensions", "")
        assert "Sec-WebSocket-Extensions" not in ws.response.headers and ws.protocol.extensions == []
        start(ws, **OPTIONS)
        send(ws, type="text", text="Hello there.")
        send(ws, type="end")
        audio, events, _ = read_all(ws)
    assert events[-1]["type"] == "done" and len(audio) == events[-1]["frames"] * FRAME_BYTES > 0


def test_flush_speaks_what_is_buffered_and_wav_has_a_header(openai_shim, triton):
    with connect(ws_url(openai_shim)) as ws:
        start(ws, response_format="wav", **OPTIONS)
        send(ws, type="text", text="no sentence end yet")
        send(ws, type="flush")
        send(ws, type="end")
        audio, events, _ = read_all(ws)
    assert [e["text"] for e in events if e["type"] == "segment.done"] == ["no sentence end yet"]
    assert audio[:4] == b"RIFF" and len(audio) == 44 + FRAMES * FRAME_BYTES
    all_free(triton)


def cancel_and_close(ws) -> None:
    """Send cancel: the stream ends with a cancelled done event and a normal close."""
    send(ws, type="cancel")
    _, events, _ = read_all(ws)
    assert events[-1]["type"] == "done" and events[-1]["cancelled"] is True
    assert (ws.close_code, ws.close_reason) == (1000, "cancelled")


def assert_cancelled_and_free(triton, before) -> None:
    """The server counted one more cancelled request, ended by an in-band STOP (the shim never
    cancels a gRPC call the server answers), and every session, row and sequence is free."""
    stopped = 'moss_tts_requests{stat="stopped"}'
    after = triton.wait_for_metrics(lambda m: m[CANCELLED] > before[CANCELLED] and m[stopped] > before[stopped])
    assert after[CANCELLED] > before[CANCELLED] and after[stopped] > before[stopped]
    all_free(triton)


def test_cancel_frees_everything(openai_shim, triton):
    before = triton.settled_metrics()
    with connect(ws_url(openai_shim)) as ws:
        start(ws, **LONG)
        send(ws, type="text", text="A long first sentence. And a second one ")
        assert len(first_audio(ws)) == FRAME_BYTES
        cancel_and_close(ws)
    assert_cancelled_and_free(triton, before)


def test_after_end_text_is_refused_and_cancel_still_stops(openai_shim, triton):
    before = triton.settled_metrics()
    with connect(ws_url(openai_shim)) as ws:
        start(ws, **LONG)
        send(ws, type="text", text="A long sentence that is still being spoken.")
        send(ws, type="end")
        first_audio(ws)
        send(ws, type="text", text="More.")
        assert event(ws)["error"]["code"] == "input_ended"
        cancel_and_close(ws)
    assert_cancelled_and_free(triton, before)


def test_a_client_that_disappears_frees_everything(openai_shim, triton):
    before = triton.settled_metrics()
    with connect(ws_url(openai_shim)) as ws:
        start(ws, **LONG)
        send(ws, type="text", text="A long first sentence. And a second one ")
        first_audio(ws)
        ws.socket.close()  # gone without a close frame
        assert_cancelled_and_free(triton, before)


def test_idle_timeout_closes_and_frees_everything(openai_shim, triton):
    before = triton.settled_metrics()
    with connect(ws_url(openai_shim)) as ws:
        start(ws, **LONG)
        send(ws, type="text", text="A long first sentence. And a second one ")
        t0 = time.monotonic()
        read_all(ws)
        assert ws.close_code == 1008 and "no message for 3 s" in ws.close_reason
        assert 2.5 < time.monotonic() - t0 < 10
    assert_cancelled_and_free(triton, before)


def test_a_bad_option_gets_an_error_event_and_the_connection_still_works(openai_shim, triton):
    with connect(ws_url(openai_shim)) as ws:
        send(ws, type="options", response_format="mp3", **OPTIONS)
        error = event(ws)
        assert error["type"] == "error" and error["error"]["param"] == "response_format", error
        send(ws, type="options", seed=-1)
        assert event(ws)["error"]["param"] == "seed"
        send(ws, type="options", input="Hello.")
        error = event(ws)["error"]
        assert error["param"] == "input" and "not with the options" in error["message"], error
        start(ws, **OPTIONS)
        send(ws, type="bogus")
        error = event(ws)
        assert error["error"]["code"] == "unknown_message_type", error
        send(ws, type="text", text="Still here.")
        send(ws, type="end")
        audio, events, _ = read_all(ws)
    assert events[-1] == {"type": "done", "segments": 1, "frames": FRAMES}
    assert len(audio) == FRAMES * FRAME_BYTES
    all_free(triton)


@pytest.mark.parametrize("when, message, code, reason", [
    ("first", '{"type": "text", "text": "Hi."}', 1008, "the first message must be the session options"),
    ("first", "not json", 1008, "a message is not JSON"),
    ("after", b"\x00\x01", 1003, "binary frames are not accepted"),
    ("after", "[1, 2]", 1008, "a message must be a JSON object"),
    ("after", json.dumps({"type": "text", "text": "word " * 401}), 1008, "--ws-max-buffered-chars"),  # fixture: 2000
])
def test_a_protocol_violation_closes_with_a_reason_and_frees_everything(openai_shim, triton, when, message, code,
                                                                       reason):
    before = triton.settled_metrics()
    with connect(ws_url(openai_shim)) as ws:
        if when == "after":
            start(ws, **LONG)
            send(ws, type="text", text="A long first sentence. And a second one ")
            first_audio(ws)
        ws.send(message)
        read_all(ws)
        assert ws.close_code == code and reason in ws.close_reason, (ws.close_code, ws.close_reason)
    if when == "after":  # the server cancelled the socket's session (not left to expire)
        assert_cancelled_and_free(triton, before)
    else:
        all_free(triton)
    after = triton.settled_metrics()  # one session at most, none opened since (its buffered text never went)
    assert after[OPENED] - before[OPENED] == (when == "after") and after[OPEN] == 0, (before, after)


def test_a_message_over_the_size_limit_closes_1009(openai_shim, triton):
    with connect(ws_url(openai_shim), max_size=None) as ws:
        ws.send(json.dumps({"type": "options", "instructions": "x" * 1_100_000}))  # --max-body-bytes 1000000
        read_all(ws)
        assert ws.close_code == 1009, (ws.close_code, ws.close_reason)
    all_free(triton)


def test_a_server_error_is_an_error_event_then_a_close(openai_shim, triton):
    """max_new_tokens passes the shim's checks (the schema's cap); the server refuses it for its
    max_seq_len (2048 rows) at the first text ([INVALID_ARGUMENT] -> 400)."""
    with connect(ws_url(openai_shim)) as ws:
        start(ws, **{**OPTIONS, "max_new_tokens": 5000})
        send(ws, type="text", text="Hello there.")
        send(ws, type="end")
        _, events, _ = read_all(ws)
        assert ws.close_code == 1008, (ws.close_code, ws.close_reason, events)
    assert events[-1]["type"] == "error" and events[-1]["status"] == 400, events
    assert "MAX_FRAMES 5000 does not fit" in events[-1]["error"]["message"], events
    all_free(triton)


UNDECODABLE = data_uri(b"RIFF this is not audio")
BAD_VOICES = [{"ref_audio": UNDECODABLE}, {"references": [{"audio": UNDECODABLE, "text": "Hi."}]},
              {"voice": "vivian"}]


def test_a_bad_voice_is_the_http_error_before_the_session_starts_and_the_connection_waits(openai_shim, triton):
    """The voice is checked when the options come (a reference by encoding it): each bad one gets the
    error POST /v1/audio/speech answers for it, as an event; options with a good reference then work."""
    with connect(ws_url(openai_shim)) as ws:
        for voice in BAD_VOICES:
            http = httpx.post(f"{openai_shim.url}/v1/audio/speech", json={"input": "Hello there.", **voice},
                              timeout=60)
            send(ws, type="options", **voice, **OPTIONS)
            error = event(ws)
            assert error == {"type": "error", "status": http.status_code, **http.json()}, (voice, error)
            assert 400 <= error["status"] < 500, error
            assert_no_object_repr(error["error"]["message"])
            if voice.get("ref_audio"):
                assert "could not be decoded (Format not recognised.)" in error["error"]["message"], error
        start(ws, ref_audio=data_uri(tone_wav(1.0, 220)), **OPTIONS)
        send(ws, type="text", text="Hello there.")
        send(ws, type="end")
        audio, events, _ = read_all(ws)
        assert ws.close_code == 1000, (ws.close_reason, events)
    assert events[-1] == {"type": "done", "segments": 1, "frames": FRAMES}
    assert len(audio) == FRAMES * FRAME_BYTES
    all_free(triton)


REF_LOOKUPS = ('moss_ref_cache_total{event="hits"}', 'moss_ref_cache_total{event="misses"}')


def ref_lookups(metrics: dict) -> float:
    """How often ref_encoder was asked for a reference's codes (cached or not)."""
    return sum(metrics[name] for name in REF_LOOKUPS)


def test_a_reference_is_encoded_once_before_the_session_starts_and_the_session_clones(openai_shim, triton):
    """ref_encoder is asked once, before session.started (no text sent yet), and never again: the
    first request carries the codes, not the audio. The voice is the reference's: the session's
    audio is POST /v1/audio/speech's for the same reference, text and seed."""
    reference = data_uri(tone_wav(1.0, 330))
    before = triton.settled_metrics()
    with connect(ws_url(openai_shim)) as ws:
        start(ws, ref_audio=reference, **OPTIONS)
        assert ref_lookups(triton.metrics()) - ref_lookups(before) == 1  # published before the answer
        send(ws, type="text", text="Hello there.")
        send(ws, type="end")
        audio, events, _ = read_all(ws)
        assert ws.close_code == 1000, (ws.close_reason, events)
    all_free(triton)
    assert ref_lookups(triton.settled_metrics()) - ref_lookups(before) == 1
    http = httpx.post(f"{openai_shim.url}/v1/audio/speech", timeout=120, json={
        "input": "Hello there.", "ref_audio": reference, "response_format": "pcm", **OPTIONS})
    assert http.status_code == 200, http.text
    assert len(audio) == FRAMES * FRAME_BYTES and audio == http.content


def test_a_reference_voice_holds_across_segments(openai_shim, triton):
    """The reference goes with the first request only (the server refuses voice inputs on later ones)."""
    with connect(ws_url(openai_shim)) as ws:
        start(ws, ref_audio=data_uri(tone_wav(1.0, 220)), **OPTIONS)
        send(ws, type="text", text="First sentence here. Second one ")
        send(ws, type="text", text="follows.")
        send(ws, type="end")
        audio, events, _ = read_all(ws)
        assert ws.close_code == 1000, (ws.close_reason, events)
    assert events[-1] == {"type": "done", "segments": 2, "frames": 2 * FRAMES}
    assert len(audio) == 2 * FRAMES * FRAME_BYTES
    all_free(triton)
