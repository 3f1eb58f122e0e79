"""The first-audio trace (pipeline/first_audio_trace.py): a request's moments, in order, one JSON
line when it ends; nothing at all while the trace is off."""

from __future__ import annotations

import json
import time

import numpy as np

from moss_tts.contract.errors import ErrorKind
from moss_tts.engine.events import CodesChunk as EngineChunk, Finished
from moss_tts.pipeline.engine_streams import CodesFeed
from moss_tts.pipeline.first_audio_trace import ENV, MOMENTS, TraceLog
from moss_tts.pipeline.request_record import RecordingClient
from moss_tts.pipeline.speech_stream import SpeechStream
from moss_tts.pipeline.stream_ports import CodesChunk, Ready
from moss_tts.vocoder.jobs import VocodeJob
from test_speech_pipeline import EMPTY, FakeChildren, FakeClient, codes


class TimedChildren(FakeChildren):
    """Codes whose engine moments lie in the past, audio whose vocoder moment is stamped."""

    def vocode(self, c, start, end, deadline=None):
        ready = super().vocode(c, start, end, deadline)
        ready.launched_at = time.monotonic()
        ready.finished_at = time.monotonic()
        return ready


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_streamed_request_writes_its_moments_in_order(tmp_path):
    trace_log = TraceLog(str(tmp_path / "trace.jsonl"))
    received = time.monotonic() - 0.01  # execute() received it 10 ms ago
    recording = RecordingClient(FakeClient(), lambda record: None, received, trace_log=trace_log, session_index=0)
    chunk = CodesChunk(codes(2), EMPTY, queued_at=received + 0.001, first_codes_at=received + 0.002)
    SpeechStream(TimedChildren([chunk, CodesChunk(codes(3, 2), EMPTY)]), recording, stream=True,
                 trace=recording.trace).run()
    trace_log.close()
    [line] = lines(tmp_path / "trace.jsonl")
    assert line["outcome"] == "ok" and line["session_index"] == 0
    assert abs(line["received"] - time.time()) < 5
    ms = line["ms"]
    assert list(ms) == list(MOMENTS)  # every moment happened, listed in the order of MOMENTS
    assert ms["queued"] == 1.0 and ms["engine"] == 2.0
    values = [ms[m] for m in ("engine", "read", "launched", "vocoded", "noticed", "sent")]
    assert values == sorted(values) and ms["thread"] <= ms["read"]


def test_a_failed_request_writes_its_outcome_and_no_audio_moments(tmp_path):
    trace_log = TraceLog(str(tmp_path / "trace.jsonl"))
    recording = RecordingClient(FakeClient(), lambda record: None, trace_log=trace_log)
    SpeechStream(FakeChildren([CodesChunk(codes(2), EMPTY)], fail_after=0), recording, stream=True,
                 trace=recording.trace).run()
    trace_log.close()
    [line] = lines(tmp_path / "trace.jsonl")
    assert line["outcome"] == "invalid" and line["session_index"] is None
    assert set(line["ms"]) == {"thread"}


def test_the_trace_is_off_unless_the_environment_names_a_file(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    assert TraceLog.from_env() is None
    recording = RecordingClient(FakeClient(), lambda record: None)
    assert recording.trace is None
    SpeechStream(FakeChildren([CodesChunk(codes(2), EMPTY)]), recording, stream=True, trace=recording.trace).run()
    monkeypatch.setenv(ENV, str(tmp_path / "on.jsonl"))
    trace_log = TraceLog.from_env()
    assert trace_log is not None and trace_log.path == str(tmp_path / "on.jsonl")
    trace_log.close()
    trace_log.write(RecordingClient(FakeClient(), lambda r: None, trace_log=trace_log).trace, "ok")  # closed: dropped
    assert (tmp_path / "on.jsonl").read_text() == ""


def test_the_feed_keeps_the_engines_first_codes_moment_and_the_job_its_end():
    feed = CodesFeed("r")
    assert feed.queued_at <= time.monotonic() and feed.first_codes_at == 0.0
    feed.put(EngineChunk("r", codes(2), 0))
    first = feed.first_codes_at
    assert first >= feed.queued_at
    feed.put(EngineChunk("r", codes(2, 2), 2))
    feed.put(Finished("r", "stop", None, 4))
    assert feed.first_codes_at == first
    job = VocodeJob("s", codes(2), True, False, lambda: None, deadline=0.0)
    assert job.launched_at == job.finished_at == 0.0
    job._finish([np.zeros((2, 8), np.float32)], None)
    assert job.finished_at >= first and job.result().shape == (2, 8)
    assert Ready(np.zeros((2, 0), np.float32)).done()
    assert ErrorKind.INVALID_ARGUMENT  # the kind the failed request above ended with
