"""Saved voices: the store (client/voices.py) on its own, and end to end through the shim with the
official SDK (`client.audio.voices`), across a shim restart, and from the gRPC client."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import numpy as np
import pytest

from client.voices import VoiceError, VoiceStore
from shared_state import SharedList

CODES = np.arange(5 * 12, dtype=np.int32).reshape(5, 12)


def test_a_voice_is_stored_once_and_found_by_id_and_name(tmp_path):
    store = VoiceStore(tmp_path)
    voice = store.create("narrator", CODES, "abc", transcript="Hello.")
    assert store.get(voice.id) == voice == store.get("narrator")
    assert np.array_equal(store.codes(voice), CODES)
    assert [v.id for v in VoiceStore(tmp_path).list()] == [voice.id]  # another process sees it
    assert store.delete(voice.id) and store.get("narrator") is None and store.list() == []
    assert not store.delete(voice.id)


@pytest.mark.parametrize("name, codes, status", [
    ("", CODES, 400), ("x" * 65, CODES, 400), ("voice_" + "a" * 24, CODES, 400),
    ("ok", np.zeros((0, 12), np.int32), 400), ("ok", np.full((3, 12), 1024, np.int32), 400),
    ("ok", np.zeros((3, 8), np.int32), 400),
])
def test_bad_voices_are_refused_naming_the_problem(tmp_path, name, codes, status):
    with pytest.raises(VoiceError) as info:
        VoiceStore(tmp_path).create(name, codes, "h")
    assert info.value.status == status
    assert VoiceStore(tmp_path).list() == []


def test_a_name_is_taken_once_even_by_racing_processes(tmp_path):
    results = SharedList()  # appended by 8 threads at once

    def create():
        try:
            results.append(VoiceStore(tmp_path).create("same", CODES, "h").id)
        except VoiceError as exc:
            results.append(exc.status)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(str, results.snapshot())).count("409") == 7 and len(VoiceStore(tmp_path).list()) == 1


def test_a_crash_leaves_nothing_half_written(tmp_path):
    store = VoiceStore(tmp_path)
    (tmp_path / ".tmp-voice_0123456789abcdef01234567-99").write_bytes(b"partial")  # died mid-write
    claim = store.names / hashlib.sha256(b"ghost").hexdigest()
    claim.write_text("voice_" + "0" * 24)  # a claim whose voice file was never written
    assert store.list() == [] and store.get("ghost") is None
    with pytest.raises(VoiceError):  # a fresh claim may be a writer still at work
        store.create("ghost", CODES, "h")
    old = time.time() - 60
    os.utime(claim, (old, old))
    assert store.create("ghost", CODES, "h").name == "ghost"  # the stale claim is taken over


def same_audio(a: bytes, b: bytes) -> bool:
    """The same PCM16 audio up to one step of the last bit. The same codes decode to float audio
    that differs by ~2e-7 with how the vocoder's rounds batched them (other streams' rows, a
    chunk merged with the next: the CPU's GEMMs round by shape), which can move a sample that
    sits on a rounding edge by one step (a CI run saw exactly one such byte). Another voice
    differs everywhere."""
    x, y = np.frombuffer(a, np.int16).astype(np.int32), np.frombuffer(b, np.int16).astype(np.int32)
    return x.shape == y.shape and x.size > 0 and int(np.abs(x - y).max()) <= 1


@pytest.mark.triton
def test_saved_voices_through_the_sdk_survive_a_restart(triton, tmp_path):
    import base64
    import io

    import openai
    import soundfile as sf

    from client.openai_shim.audio_encode import to_pcm16
    from client.tts_client import TTSClient, build_inputs
    from shim_server import start_shim, stop_shim

    t = np.arange(24000) / 24000
    buffer = io.BytesIO()
    sf.write(buffer, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000, format="WAV")
    wav = buffer.getvalue()
    voices_dir = tmp_path / "voices"
    fixed = {"seed": 7, "max_new_tokens": 6, "ignore_stop": True, "sample_rate": 48000, "channels": 2}

    def speak(client, voice, **extra):
        return client.audio.speech.create(model="moss-tts", voice=voice, input="Hello there.", response_format="pcm",
                                          extra_body={**fixed, **extra}).content

    shim = start_shim(triton.grpc_url, tmp_path / "shim.log", tmp_path, "--metrics-url", triton.metrics_url,
                      "--voices-dir", str(voices_dir))
    try:
        client = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="none")
        voice = client.audio.voices.create(name="narrator", audio_sample=("ref.wav", wav, "audio/wav"),
                                           consent="cons_test")
        assert voice.id.startswith("voice_") and voice.name == "narrator"
        with pytest.raises(openai.ConflictError):
            client.audio.voices.create(name="narrator", audio_sample=("ref.wav", wav, "audio/wav"), consent="c")
        # The saved codes are exactly what a data-URI clone encodes: same request, same audio.
        cloned = speak(client, "default", ref_audio="data:audio/wav;base64," + base64.b64encode(wav).decode())
        assert same_audio(speak(client, "narrator"), cloned) and same_audio(speak(client, {"id": voice.id}), cloned)
        assert not same_audio(speak(client, "default"), cloned)  # another voice: other audio
        with pytest.raises(openai.BadRequestError) as info:
            speak(client, "nobody")
        assert "not a voice of this server" in str(info.value)
    finally:
        stop_shim(shim)
    shim = start_shim(triton.grpc_url, tmp_path / "shim2.log", tmp_path, "--metrics-url", triton.metrics_url,
                      "--voices-dir", str(voices_dir))
    try:
        client = openai.OpenAI(base_url=f"{shim.url}/v1", api_key="none")
        assert [v["name"] for v in client.get("/audio/voices", cast_to=dict)["data"]] == ["narrator"]
        assert same_audio(speak(client, "narrator"), cloned)
        # The gRPC client uses the same directory and sends the same codes.
        codes = VoiceStore(voices_dir).codes(VoiceStore(voices_dir).get("narrator"))
        grpc_audio = TTSClient(triton.grpc_url).synthesize(
            build_inputs("Hello there.", reference_codes=codes, seed=7, max_frames=6, ignore_stop=True)).audio
        assert same_audio(to_pcm16(grpc_audio.T), cloned)
        client.audio.voices.delete(voice.id)
        with pytest.raises(openai.NotFoundError):
            client.audio.voices.delete(voice.id)
    finally:
        stop_shim(shim)
