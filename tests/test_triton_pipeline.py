"""End to end against the real tritonserver: streaming, batching, cache, cancellation, errors."""

from __future__ import annotations

import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile as sf

from client.tts_client import InferenceServerException, TTSClient, build_inputs, error_code
from perf.soak_metrics import vocoder_sessions
from test_error_text import assert_no_object_repr

pytestmark = pytest.mark.triton

SPF = 3840  # samples per frame per channel


def tone_wav(seconds: float, freq: float, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def speak(triton, text="Hello world.", **options):
    options.setdefault("seed", 7)
    return TTSClient(triton.grpc_url).synthesize(build_inputs(text, **options))


def test_streaming_equals_non_streaming(triton):
    streamed = speak(triton, stream=True, max_frames=23, ignore_stop=True, first_chunk_frames=2, chunk_frames=5)
    whole = speak(triton, stream=False, max_frames=23, ignore_stop=True)
    # Chunks grow by what was already sent, up to CHUNK_FRAMES (engine/request.chunk_target).
    assert [c.shape[1] for c in streamed.chunks] == [2 * SPF, 4 * SPF, 5 * SPF, 5 * SPF, 5 * SPF, 2 * SPF]
    assert len(whole.chunks) == 1 and whole.audio.shape == (2, 23 * SPF)
    assert whole.audio.dtype == np.float32 and np.isfinite(whole.audio).all()
    peak = np.abs(whole.audio).max()
    assert peak > 0 and np.abs(streamed.audio - whole.audio).max() <= 1e-6 * peak


def test_codes_ensemble_streams_code_rows(triton):
    client = TTSClient(triton.grpc_url)
    chunks = list(client.stream(build_inputs("Codes please.", ensemble=True, seed=3, max_frames=7, ignore_stop=True,
                                             first_chunk_frames=1, chunk_frames=3),
                                model="moss_tts_codes", output="CODES"))
    assert [c.shape for c in chunks] == [(1, 12), (2, 12), (3, 12), (1, 12)]
    codes = np.concatenate(chunks)
    assert codes.dtype == np.int32 and codes.min() >= 0 and codes.max() < 1024


def test_clone_and_continuation(triton):
    ref = tone_wav(1.2, 200.0)
    clone = speak(triton, reference_audio=ref, max_frames=6, ignore_stop=True, stream=False)
    assert clone.audio.shape == (2, 6 * SPF)
    cont = speak(triton, "and this follows.", reference_audio=ref, reference_text="This was said. ",
                 mode="continuation", max_frames=4, ignore_stop=True, stream=True)
    assert cont.audio.shape == (2, 4 * SPF)  # the reference's own audio is not returned


def test_eight_concurrent_streams_are_batched(triton):
    before = triton.settled_metrics()['moss_engine{stat="requests_finished"}']
    gate = threading.Barrier(8)

    def one(i):
        gate.wait()
        return speak(triton, f"Stream number {i}.", seed=i, max_frames=30, ignore_stop=True, stream=True)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert all(r.audio.shape == (2, 30 * SPF) for r in results)
    assert len({r.audio[:, :SPF].tobytes() for r in results}) == 8  # different seeds, different audio
    alone = speak(triton, "Stream number 3.", seed=3, max_frames=30, ignore_stop=True, stream=True)
    assert np.abs(alone.audio - results[3].audio).max() <= 1e-6 * np.abs(alone.audio).max()
    metrics = triton.wait_for_metrics(lambda m: m['moss_engine{stat="requests_finished"}'] >= before + 9)
    assert metrics['moss_engine{stat="max_batch_size_seen"}'] > 1  # continuous batching really batched


def test_reference_cache_hit_and_single_flight(triton):
    ref = tone_wav(0.9, 333.0)
    m0 = triton.metrics()
    speak(triton, reference_audio=ref, max_frames=2, ignore_stop=True)
    speak(triton, reference_audio=ref, max_frames=2, ignore_stop=True)
    m1 = triton.metrics()
    assert m1['moss_ref_cache_total{event="items_encoded"}'] - m0['moss_ref_cache_total{event="items_encoded"}'] == 1
    assert m1['moss_ref_cache_total{event="hits"}'] - m0['moss_ref_cache_total{event="hits"}'] == 1

    new_ref = tone_wav(1.1, 555.0)
    gate = threading.Barrier(6)

    def one(i):
        gate.wait()
        return speak(triton, reference_audio=new_ref, seed=i, max_frames=2, ignore_stop=True)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(one, range(6)))
    m2 = triton.metrics()
    assert m2['moss_ref_cache_total{event="items_encoded"}'] - m1['moss_ref_cache_total{event="items_encoded"}'] == 1


STOPPED = 'moss_tts_requests{stat="stopped"}'


def long_utterance():
    return build_inputs("A very long utterance.", seed=1, max_frames=1900, ignore_stop=True, first_chunk_frames=1,
                        chunk_frames=1, stream=True)


@pytest.mark.parametrize("end", ["stop", "grpc_cancel"])
def test_an_utterance_left_early_frees_engine_rows_and_vocoder_slot(triton, end):
    """Closing TTSClient.stream early sends an in-band STOP (the ledger counts it; no gRPC cancel);
    a third-party client's gRPC cancel (stop_stream(cancel_requests=True)) frees everything too."""
    import queue

    import tritonclient.grpc as grpcclient

    before = triton.settled_metrics()
    before_cancelled = before['moss_engine{stat="requests_cancelled"}']
    if end == "stop":
        stream = TTSClient(triton.grpc_url).stream(long_utterance())
        first = next(stream)
    else:
        events, client = queue.Queue(), grpcclient.InferenceServerClient(triton.grpc_url)
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        client.async_stream_infer("moss_tts", long_utterance(), outputs=[grpcclient.InferRequestedOutput("AUDIO")])
        result, error = events.get(timeout=60)
        assert error is None
        first = result.as_numpy("AUDIO")
    assert first.shape == (2, SPF)
    # The gauges refresh every 0.25 s: the snapshot read right after the first chunk can predate it.
    in_use = lambda m: m['moss_engine{stat="running"}'] >= 1 or vocoder_sessions(m) >= 1
    during = triton.wait_for_metrics(in_use, timeout=10)
    assert in_use(during), during
    if end == "stop":
        stream.close()  # a STOP on the stream; the stream half-closed once both finals came
    else:
        client.stop_stream(cancel_requests=True)
        client.close()
    # requests_cancelled first: the gauges refresh every 0.25 s, so a snapshot from before the
    # request was admitted would also read running == 0.
    after = triton.wait_for_metrics(lambda m: m['moss_engine{stat="requests_cancelled"}'] > before_cancelled
                                    and triton.is_idle(m))
    assert triton.is_idle(after), after
    assert after['moss_engine{stat="requests_cancelled"}'] > before_cancelled
    frames = after['moss_engine{stat="frames_generated"}'] - before['moss_engine{stat="frames_generated"}']
    assert frames < 1900  # it really stopped early
    assert after[STOPPED] - before[STOPPED] == (1 if end == "stop" else 0)


def test_a_stop_on_the_stream_ends_its_request_with_cancelled_and_gets_its_own_empty_final(triton):
    """The protocol as a client sees it: request R, then on the same stream a STOP naming R; R ends
    with [CANCELLED], the STOP with an empty final response, and the stream, half-closed, ends OK."""
    import queue

    import tritonclient.grpc as grpcclient

    from client.tts_client import stop_inputs

    events, client = queue.Queue(), grpcclient.InferenceServerClient(triton.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer("moss_tts", long_utterance(), request_id="utt-stop-1",
                                  outputs=[grpcclient.InferRequestedOutput("AUDIO")], enable_empty_final_response=True)
        result, error = events.get(timeout=60)
        assert error is None and result.get_response().id == "utt-stop-1"
        client.async_stream_infer("moss_tts", stop_inputs("utt-stop-1"), request_id="utt-stop-1.stop",
                                  enable_empty_final_response=True)
        errors, stop_finals = [], []
        while len(errors) + len(stop_finals) < 2:
            result, error = events.get(timeout=30)
            if error is not None:
                errors.append(error)
            elif result.get_response().id == "utt-stop-1.stop":
                assert result.get_response().parameters["triton_final_response"].bool_param
                assert not result.get_response().outputs  # empty
                stop_finals.append(result)
            else:  # R's chunks still in flight
                assert result.get_response().id == "utt-stop-1"
        assert len(errors) == 1 and error_code(errors[0]) == "CANCELLED", errors
        assert len(stop_finals) == 1
    finally:
        client.stop_stream(cancel_requests=False)  # both ended: half-closed, read to its status
        client.close()
    assert triton.is_idle(triton.wait_for_metrics(triton.is_idle, fresh=True))


def test_a_malformed_stop_is_invalid_argument(triton):
    from client.tts_client import option_input

    with pytest.raises(InferenceServerException) as info:
        TTSClient(triton.grpc_url).synthesize([option_input("TEXT", ""), option_input("STOP", "x"),
                                               option_input("SEED", 3)])
    assert error_code(info.value) == "INVALID_ARGUMENT" and "it also has SEED" in str(info.value)


BAD_INPUTS = [
    (dict(text=""), "TEXT is empty"),
    (dict(text="   \n "), "TEXT is empty"),
    (dict(text="x" * 20001), "limit is 20000"),
    (dict(text=b"\xff\xfe bad utf8"), "not valid UTF-8"),
    (dict(temperature=-1.0), "temperature must be in"),
    (dict(temperature=float("nan")), "finite number"),
    (dict(top_p=0.0), "top_p must be in"),
    (dict(top_p=1.5), "top_p must be in"),
    (dict(top_k=-5), "top_k must be"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be in"),
    (dict(seed=-3), "seed must be"),
    (dict(max_frames=0), "max_frames must be in"),
    (dict(max_frames=100000), "max_frames must be in"),
    (dict(tokens=0), "TOKENS must be in"),
    (dict(text="${token:abc}Hello"), "prefix must be a positive integer"),
    (dict(mode="sing"), "MODE must be one of"),
    (dict(mode="continuation"), "continuation needs REFERENCE_AUDIO"),
    (dict(first_chunk_frames=0), "FIRST_CHUNK_FRAMES must be in"),
    (dict(reference_audio=b"RIFF this is not audio"), "could not be decoded (Format not recognised.)"),
    (dict(reference_audio=None), None),  # placeholder replaced below: a reference over 100 s
]
BAD_INPUTS[-1] = (dict(reference_audio="LONG"), "limit is 100 s")


@pytest.mark.parametrize("options, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_invalid_argument_and_server_keeps_serving(triton, options, message):
    options = dict(options)
    if options.get("reference_audio") == "LONG":
        options["reference_audio"] = tone_wav(101.0, 100.0, rate=8000)
    text = options.pop("text", "Hello.")
    client = TTSClient(triton.grpc_url)
    inputs = build_inputs("x", **options)
    if isinstance(text, bytes):
        inputs[0].set_data_from_numpy(np.array([text], dtype=object))
    else:
        inputs[0].set_data_from_numpy(np.array([text.encode()], dtype=object))
    with pytest.raises(InferenceServerException) as info:
        client.synthesize(inputs)
    assert error_code(info.value) == "INVALID_ARGUMENT", info.value.message()
    assert message in info.value.message()
    assert_no_object_repr(info.value.message())
    assert triton.is_alive()
    assert speak(triton, max_frames=2, ignore_stop=True).audio.shape == (2, 2 * SPF)


def test_perf_analyzer_streaming_smoke(triton, tmp_path):
    import subprocess

    from conftest import ROOT

    proc = subprocess.run(["bash", str(ROOT / "perf" / "perf_analyzer_smoke.sh"), triton.grpc_url, str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Detected decoupled model" in proc.stdout or "Throughput" in proc.stdout
    assert (tmp_path / "perf.csv").read_text().count("\n") >= 2


def test_end_to_end_liveness_probe(triton):
    from client.healthcheck import probe

    assert probe(triton.grpc_url, timeout=60) is None
    assert probe("127.0.0.1:1", timeout=10) is not None  # nothing listens there


def test_ref_encoder_encodes_every_reference_of_a_batched_request(triton):
    """A request of two references ([2, 1]: 2 s and 1 s) gets one row of codes each, the shorter
    padded with -1; one bad item fails the request naming it."""
    import tritonclient.grpc as grpcclient

    def infer(items):
        tensor = grpcclient.InferInput("REFERENCE_AUDIO", [len(items), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(items, dtype=object).reshape(-1, 1))
        client = grpcclient.InferenceServerClient(triton.grpc_url)
        try:
            return client.infer("ref_encoder", [tensor]).as_numpy("REFERENCE_CODES")
        finally:
            client.close()

    two, one = tone_wav(2.0, 300.0), tone_wav(1.0, 500.0)
    codes = infer([two, one])
    alone = [infer([two])[0], infer([one])[0]]
    assert codes.shape == (2, alone[0].shape[0], 12) and alone[1].shape[0] < alone[0].shape[0]
    assert np.array_equal(codes[0], alone[0])
    assert np.array_equal(codes[1, :alone[1].shape[0]], alone[1]) and (codes[1, alone[1].shape[0]:] == -1).all()
    assert (alone[1] >= 0).all()
    with pytest.raises(InferenceServerException) as info:
        infer([two, b"RIFF this is not audio"])
    assert error_code(info.value) == "INVALID_ARGUMENT" and "item 1 of 2" in info.value.message()


@pytest.mark.parametrize("case", ["wrong dtype", "wrong shape", "missing TEXT", "unknown input"])
def test_tritons_own_refusals_classify_as_invalid_argument(triton, case):
    """Triton rejects these before moss_tts sees them, with its own untagged wording."""
    import tritonclient.grpc as grpcclient

    inputs = build_inputs("Hello.", max_frames=2)
    if case == "wrong dtype":
        extra = grpcclient.InferInput("TOP_P", [1], "FP64")
        extra.set_data_from_numpy(np.array([0.5], dtype=np.float64))
        inputs.append(extra)
    elif case == "wrong shape":
        extra = grpcclient.InferInput("TOP_P", [2], "FP32")
        extra.set_data_from_numpy(np.array([0.5, 0.5], dtype=np.float32))
        inputs.append(extra)
    elif case == "missing TEXT":
        inputs = inputs[1:]
    else:
        extra = grpcclient.InferInput("TOPP", [1], "FP32")
        extra.set_data_from_numpy(np.array([0.5], dtype=np.float32))
        inputs.append(extra)
    with pytest.raises(InferenceServerException) as info:
        TTSClient(triton.grpc_url).synthesize(inputs)
    assert error_code(info.value) == "INVALID_ARGUMENT", info.value.message()


def test_a_long_reference_is_served_with_the_default_length(triton):
    """A 95 s reference (1187 prompt rows): the default length shrinks to what max_seq_len leaves
    instead of refusing the request (it was `prompt + max_frames exceeds max_seq_len`)."""
    client = TTSClient(triton.grpc_url)
    chunks = client.stream(build_inputs("Keep going.", reference_audio=tone_wav(95.0, 220.0, rate=8000), seed=3))
    first = next(chunks)
    chunks.close()  # cancels: a random-weight model may not stop for thousands of frames
    assert first.shape[0] == 2 and first.shape[1] >= SPF
    with pytest.raises(InferenceServerException) as info:
        speak(triton, reference_audio=tone_wav(95.0, 220.0, rate=8000), max_frames=5000)
    message = info.value.message()
    assert error_code(info.value) == "INVALID_ARGUMENT" and "MAX_FRAMES 5000 does not fit" in message
    assert "2048" in message and "ask for at most" in message


def test_long_form_text_is_one_continuous_stream_and_a_cancel_frees_everything(triton):
    """A text longer than one segment is generated segment by segment in the same voice and
    arrives as one stream (one vocoder session); cancelling it mid-way frees every row and slot."""
    from moss_tts.contract.text_segments import split_text

    text = " ".join(f"This is sentence number {i} of a rather long text, spoken in one voice." for i in range(20))
    segments = split_text(text)
    assert len(segments) >= 3
    audio = speak(triton, text=text, max_frames=4, ignore_stop=True, seed=5).audio
    assert audio.shape == (2, 4 * len(segments) * SPF)  # MAX_FRAMES applies per segment
    before = triton.settled_metrics()['moss_engine{stat="requests_finished"}']  # the segments above counted
    chunks = TTSClient(triton.grpc_url).stream(build_inputs(text, max_frames=200, ignore_stop=True, seed=6))
    next(chunks)
    chunks.close()
    after = triton.wait_for_metrics(triton.is_idle, fresh=True)  # not gauges from before the stream
    assert triton.is_idle(after), after
    assert after['moss_engine{stat="requests_finished"}'] - before < len(segments)  # later segments never ran


def test_speak_shows_progress_for_long_text_and_writes_the_whole_file(triton, tmp_path):
    import subprocess
    import sys

    text = " ".join(f"Sentence {i} is one of many in this long text, all of them spoken." for i in range(20))
    out = tmp_path / "long.wav"
    run = subprocess.run([sys.executable, "-m", "client.speak", text, "-o", str(out), "--url", triton.grpc_url,
                          "--seed", "2", "--max-frames", "3", "--stream", "--progress"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    assert "-segment text received" in run.stderr
    data, rate = sf.read(str(out))
    # No --ignore-stop in speak: the random-weight model may stop any segment early.
    assert rate == 48000 and data.shape[1] == 2 and data.shape[0] % SPF == 0 and data.shape[0] >= SPF


# Long-form length: 150 s by default (10 minutes: MOSS_LONG_FORM_SECONDS=600). Past the first
# segments nothing new happens per segment or per frame, so more audio proves nothing the memory
# bound below does not: the entry's RSS is flat within 1 MB from 5 s of audio on (150 s measured,
# 2026-12-02), and keeping the stream's audio would add 29 MB (int16) to 58 MB (float32) over it.
LONG_FORM_S = float(os.environ.get("MOSS_LONG_FORM_SECONDS", "150"))
LONG_FORM_GROWTH_MB = 16  # RSS the entry may gain from a quarter of the stream to its end


def test_minutes_of_speech_in_one_stream_with_bounded_state(triton):
    """Long-form at length: 26 segments, LONG_FORM_S of 48 kHz stereo in one stream, while the
    engine holds at most one row and the vocoder one session for it, and the entry's memory stays
    flat: what it gains from a quarter of the stream to the end is under LONG_FORM_GROWTH_MB (a
    bound far below what keeping the audio would cost: 192 kB per second of audio even as int16)."""
    from moss_tts.contract.text_segments import split_text

    from triton_server import stub_pids

    text = "The quick brown fox jumps over the lazy dog, again and again, all day long. " * 130
    segments = split_text(text)
    frames = -(-round(LONG_FORM_S * 12.5) // len(segments))  # per segment, so that the whole is >= LONG_FORM_S
    pid = stub_pids(triton)["moss_tts_0_0"]
    rss = lambda: int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0]) * 1024  # noqa: E731
    total, quarter = len(segments) * frames * SPF, None
    peak_rows, peak_sessions, samples = 0, 0, 0
    for i, chunk in enumerate(TTSClient(triton.grpc_url).stream(
            build_inputs(text, max_frames=frames, ignore_stop=True, seed=9, chunk_frames=100), timeout=300)):
        samples += chunk.shape[1]
        if quarter is None and samples >= total // 4:
            quarter = rss()
        if i % 10 == 0:
            m = triton.metrics()
            peak_rows = max(peak_rows, m['moss_engine{stat="running"}'])
            peak_sessions = max(peak_sessions, vocoder_sessions(m))
    assert samples == total and samples >= LONG_FORM_S * 48000
    assert peak_rows <= 1 and peak_sessions <= 1
    grown_mb = (rss() - quarter) / 2**20
    assert grown_mb < LONG_FORM_GROWTH_MB, f"the entry's memory grew {grown_mb:.1f} MB over 3/4 of the stream"
