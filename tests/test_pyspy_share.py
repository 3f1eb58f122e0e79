"""perf/pyspy_share.py reads py-spy's raw records and gives the figures perf/RESULTS.md quotes
from the committed records of issue 34's third round (call 1: before the GIL fixes)."""

from __future__ import annotations

import gzip
from pathlib import Path

from perf.pyspy_share import load, main, shares

RESULTS = Path(__file__).resolve().parents[1] / "perf" / "results" / "issue34"


def test_the_gil_record_of_call_1_gives_the_gauge_stall(capsys):
    stacks = load(RESULTS / "r3-pyspy-gil-92131d6-call1.txt.gz")
    by_kind, by_leaf = shares(stacks)
    total = sum(by_kind.values())
    assert total == 1173
    gauge = sum(n for (k, leaf), n in by_leaf.items() if leaf.endswith("GcWatch.stats:83"))
    assert gauge == 234  # 19.9% of the samples that held the GIL
    main([str(RESULTS / "r3-pyspy-gil-92131d6-call1.txt.gz"), "--seconds", "40", "--top", "3"])
    out = capsys.readouterr().out
    assert "1173 samples, 59% of the sampling instants" in out and "GcWatch.stats:83" in out


def test_the_native_record_of_call_1_gives_the_gil_waits_of_the_engine_and_the_vocoder():
    stacks = load(RESULTS / "r3-pyspy-native-92131d6-call1.txt.gz")
    for thread, frame, at_least in (("engine", "RequestState.take_chunk:166", 0.47),
                                    ("vocoder", "CodecDecodeState.reset_rows:60", 0.38),
                                    ("vocoder", "VocoderWorker._complete:283", 0.16)):
        by_kind, by_leaf = shares(stacks, native=True, thread=thread)
        part = sum(n for (_, leaf), n in by_leaf.items() if leaf.startswith(frame)) / by_kind[thread]
        assert at_least <= part < at_least + 0.05, (thread, frame, part)


def test_plain_and_gzipped_records_and_thread_kinds(tmp_path):
    lines = ["thread (1): moss-tts-engine;Engine._loop (moss_tts/engine/engine.py:147) 3",
             "thread (2): moss_tts_0_0-stream_7;SpeechStream.run (moss_tts/pipeline/speech_stream.py:137) 2",
             "thread (3): MainThread;TritonPythonModel.execute (model.py:150);get (triton_io.py:47) 1",
             "thread (4): MainThread 4", ""]
    plain = tmp_path / "r.txt"
    plain.write_text("\n".join(lines))
    packed = tmp_path / "r.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        by_kind, by_leaf = shares(load(path))
        assert by_kind == {"engine": 3, "stream": 2, "execute": 1, "main": 4}
        assert by_leaf[("execute", "TritonPythonModel.execute:150 > get:47")] == 1
