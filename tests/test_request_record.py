"""RecordingClient: one record per request, with what the operator's histograms need."""

from __future__ import annotations

import numpy as np
import pytest

from moss_tts.contract.errors import ErrorKind
from moss_tts.pipeline.request_record import RecordingClient


class Client:
    def __init__(self):
        self.calls = []

    def send(self, audio, codes, context, final):
        self.calls.append(("send", codes.shape[0], final))

    def send_error(self, message, kind):
        self.calls.append(("error", kind))

    def send_final(self):
        self.calls.append(("final",))

    def is_cancelled(self):
        return False


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def recorded(steps):
    records, clock, client = [], Clock(), Client()
    recording = RecordingClient(client, records.append, clock=clock)
    for advance, call in steps:
        clock.now += advance
        call(recording)
    return records, client


def test_a_streamed_request_records_first_audio_duration_and_audio_seconds():
    codes = lambda n: np.zeros((n, 12), np.int32)  # noqa: E731
    records, client = recorded([(0.2, lambda c: c.send(None, codes(2), None, False)),
                                (0.3, lambda c: c.send(None, codes(10), None, False)),
                                (0.5, lambda c: c.send_final())])
    assert client.calls == [("send", 2, False), ("send", 10, False), ("final",)]  # passed through
    (record,) = records
    assert record.outcome == "ok" and record.first_output_s == pytest.approx(0.2)
    assert record.duration_s == pytest.approx(1.0) and record.audio_s == pytest.approx(12 / 12.5)
    assert record.rtf == pytest.approx(1.0 / 0.96)


def test_errors_record_their_kind_and_a_request_without_audio_has_no_rtf():
    records, _ = recorded([(0.1, lambda c: c.send_error("gone", ErrorKind.CANCELLED))])
    assert records[0].outcome == "cancelled" and records[0].first_output_s is None and records[0].rtf is None
    records, _ = recorded([(0.1, lambda c: c.send_error("bad", ErrorKind.INVALID_ARGUMENT))])
    assert records[0].outcome == "invalid"


def test_a_failing_metrics_sink_never_breaks_the_request():
    client = Client()

    def broken(record):
        raise RuntimeError("IPC down")

    RecordingClient(client, broken).send(None, np.zeros((3, 12), np.int32), None, True)
    assert client.calls == [("send", 3, True)]
