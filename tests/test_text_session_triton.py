"""Text sessions end to end against the real tritonserver (tiny checkpoint, CPU): text in as it
is written, one voice and one vocoder sequence, audio out in text order; everything freed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import soundfile as sf
import tritonclient.grpc as grpcclient

from client.tts_client import TTSClient, build_inputs
from shared_state import SharedList
from triton_server import ROOT

pytestmark = pytest.mark.triton

SPF = 3840  # samples per frame per channel
FRAMES = 6  # every segment: exactly this many frames (ignore_stop), so the audio length is known
OPTIONS = dict(seed=5, max_frames=FRAMES, ignore_stop=True, first_chunk_frames=2, chunk_frames=2)
TEXT = ("Good morning to you all. The weather is fine today, and the sun is out. "
        "We will walk to the park after lunch.")
STARTED = 'moss_tts_vocoder{stat="sessions_started"}'
OPEN = 'moss_tts_sessions{stat="open"}'


def all_free(triton):
    """Wait until no session, engine row, stream or vocoder sequence is held, in gauges computed
    after this call; assert it. A read at once could show gauges from before the test's work: a
    session opened and cancelled within one refresh read as free, then as open."""
    m = triton.wait_for_metrics(lambda m: m.get(OPEN) == 0 and m['moss_tts_sessions{stat="waiting"}'] == 0
                                and triton.is_idle(m), timeout=20, fresh=True)
    assert m.get(OPEN) == 0 and triton.is_idle(m), m


def speak_session(triton, pieces, delay_s=0.0):
    """Send `pieces` (with a pause between), end; -> (session, chunks, first audio time, last send time)."""
    session = TTSClient(triton.grpc_url).text_session(codes=True, **OPTIONS)
    sent = {}

    def writer():
        for piece in pieces:
            session.send_text(piece)
            time.sleep(delay_s)
        sent["last"] = time.monotonic()
        session.end()

    thread = threading.Thread(target=writer)
    thread.start()
    chunks, first = [], None
    for chunk in session.chunks():
        first = first or (time.monotonic() if chunk.audio.size else None)
        chunks.append(chunk)
    thread.join()
    return session, chunks, first, sent["last"]


def segment_codes(chunks):
    by_segment = {}
    for chunk in chunks:
        by_segment.setdefault(chunk.segment, []).append(chunk.codes)
    return [np.concatenate(parts) for _, parts in sorted(by_segment.items())]


def test_words_with_delays_are_spoken_as_they_come_in_one_vocoder_sequence(triton):
    before = triton.settled_metrics()
    words = TEXT.split(" ")
    session, chunks, first, last_sent = speak_session(triton, [w + " " for w in words[:-1]] + [words[-1]], 0.25)
    assert session.segments == ["Good morning to you all.", "The weather is fine today, and the sun is out.",
                                "We will walk to the park after lunch."]
    assert first is not None and first < last_sent  # the first sentence spoke while the rest was written
    assert [c.segment for c in chunks] == sorted(c.segment for c in chunks)  # audio in text order
    audio = np.concatenate([c.audio for c in chunks], axis=1)
    assert audio.shape == (2, len(session.segments) * FRAMES * SPF)
    assert [len(c) for c in segment_codes(chunks)] == [FRAMES] * 3
    after = triton.wait_for_metrics(lambda m: m[STARTED] >= before[STARTED] + 1)
    all_free(triton)
    after = triton.settled_metrics()
    assert after[STARTED] - before[STARTED] == 1  # one vocoder sequence for the whole session
    assert after['moss_tts_sessions{stat="ended"}'] - before['moss_tts_sessions{stat="ended"}'] == 1


def test_whole_and_word_by_word_give_the_same_segments_and_codes(triton):
    whole, whole_chunks, _, _ = speak_session(triton, [TEXT])
    words = TEXT.split(" ")
    pieces, pieces_chunks, _, _ = speak_session(triton, [w + " " for w in words[:-1]] + [words[-1]])
    assert whole.segments == pieces.segments and len(whole.segments) == 3
    for a, b in zip(segment_codes(whole_chunks), segment_codes(pieces_chunks), strict=True):
        assert np.array_equal(a, b)
    all_free(triton)


def cancel_after_first_chunk(url: str) -> float:
    """A long session cancelled by its client once its first audio (one frame) came: the seconds
    cancel() took."""
    session = TTSClient(url).text_session(seed=1, max_frames=1900, ignore_stop=True, first_chunk_frames=1,
                                          chunk_frames=1)
    session.send_text("A long first sentence. And a second one ")
    assert next(session.chunks()).audio.shape == (2, SPF)
    started = time.monotonic()
    session.cancel()
    return time.monotonic() - started


def test_cancel_mid_session_frees_everything(triton):
    """The cancel is an in-band STOP of the running request (the ledger counts it), answered well
    within the client's wait (no gRPC cancel followed)."""
    from client.tts_client import STOP_WAIT_S

    before = triton.settled_metrics()
    took = cancel_after_first_chunk(triton.grpc_url)
    assert took < STOP_WAIT_S - 1.0, f"cancel() took {took:.1f} s: the gRPC cancel fallback?"
    cancelled, stopped = 'moss_tts_sessions{stat="cancelled"}', 'moss_tts_requests{stat="stopped"}'
    after = triton.wait_for_metrics(lambda m: m[cancelled] > before[cancelled] and m[stopped] > before[stopped])
    assert after[cancelled] > before[cancelled] and after[stopped] == before[stopped] + 1
    all_free(triton)


def raw_stream(triton):
    """A gRPC stream whose callback, on the client's stream thread, records (result, error) while the
    test reads them: a SharedList."""
    events = SharedList()
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    client.start_stream(callback=lambda result, error: events.append((result, error)))
    return client, events


def test_bad_messages_get_invalid_argument_and_leave_everything_free(triton):
    client, events = raw_stream(triton)
    send = lambda text, request_id, **o: client.async_stream_infer(  # noqa: E731
        "moss_tts", build_inputs(text, **o), request_id=request_id, enable_empty_final_response=True)
    send("Hello there.", "0", session_id="bad-1", **OPTIONS)
    send("More.", "1", session_id="bad-1", reference_codes=np.zeros((3, 12), np.int32), **OPTIONS)
    send("", "2", session_id="bad-1", session_end=True)
    send("", "3", session_id="never-opened", session_end=True)
    deadline = time.monotonic() + 60
    while len([e for e in events.snapshot() if e[1] is not None or
               e[0].get_response().parameters["triton_final_response"].bool_param]) < 4:
        assert time.monotonic() < deadline, events.snapshot()
        time.sleep(0.05)
    client.stop_stream()
    client.close()
    messages = [e.message() for _, e in events.snapshot() if e is not None]
    assert len(messages) == 2, messages
    assert any("REFERENCE_CODES" in m and "first request" in m for m in messages), messages
    assert any("SESSION_END for unknown session 'never-opened'" in m for m in messages), messages
    assert all(m.startswith("[INVALID_ARGUMENT]") for m in messages), messages
    all_free(triton)


def test_speak_text_stdin_speaks_piped_text(triton, tmp_path):
    out = tmp_path / "stdin.wav"
    process = subprocess.Popen(
        [sys.executable, "-m", "client.speak", "--text-stdin", "-o", str(out), "--url", triton.grpc_url,
         "--seed", "2", "--max-frames", str(FRAMES)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'python_backends'}"), text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for word in "First sentence here. Second one follows.".split(" "):
        process.stdin.write(word + " ")
        process.stdin.flush()
        time.sleep(0.1)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert "segment 1 spoken" in stderr and "segment 2 spoken" in stderr, stderr
    assert "2 segment(s)" in stdout
    audio, rate = sf.read(out)
    assert rate == 48000 and 0 < audio.shape[0] <= 2 * FRAMES * SPF
    all_free(triton)
