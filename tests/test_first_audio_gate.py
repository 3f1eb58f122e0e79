"""The engine's first-audio hold (engine/first_audio_gate.py, EngineConfig.first_audio_hold_rows):
the gate's hand-off, and an engine on the tiny model that holds at light load only, waits for the
vocoder's post (or its timeout), and still equals the reference loop frame for frame."""

from __future__ import annotations

import threading

import pytest

from moss_tts.contract.sampling_params import SamplingParams
from moss_tts.engine import Engine, EngineConfig, EngineConfigError, EngineRequest
from moss_tts.engine.events import CodesChunk
from moss_tts.engine.first_audio_gate import FirstAudioGate
from moss_tts.model.generation import generate

from engine_events import TIMEOUT_S, Collector, assert_matches_reference

POST_DELAY_S = 0.03  # the stand-in vocoder posts its round this long after a first chunk


def test_a_post_after_the_mark_ends_the_wait_and_one_before_does_not():
    gate = FirstAudioGate(timeout_s=0.01)
    gate.round_launched("old")
    mark = gate.mark()
    assert gate.wait_round(mark) == (False, None)  # only posts after the mark count
    threading.Timer(0.02, gate.round_launched, args=("new",)).start()
    assert gate.wait_round(mark, timeout_s=TIMEOUT_S) == (True, "new")
    assert gate.wait_round(mark - 1, timeout_s=0) == (True, "new")


def test_the_hold_rows_are_validated():
    with pytest.raises(EngineConfigError, match="first_audio_hold_rows"):
        EngineConfig(first_audio_hold_rows=-1)


@pytest.fixture(scope="module")
def requests(builder):
    from moss_tts.model.processor import PromptSpec

    prompts = [builder.build(PromptSpec(text)) for text in ("Hello there.", "Good morning, everyone.", "Bye.")]
    params = [SamplingParams(seed=300 + i, max_frames=9 + i, ignore_stop=True) for i in range(3)]
    return prompts, params


def run(model, prompts, params, hold_rows: int, post: bool, together: bool):
    """The engine with a gate; a stand-in vocoder posts POST_DELAY_S after each first chunk (if
    `post`). Requests one after another (light load), or all at once (`together`)."""
    gate = FirstAudioGate(timeout_s=1.0) if post else FirstAudioGate()  # a post always comes in time
    sink, first_chunks = Collector(), []

    def on_event(event):
        if isinstance(event, CodesChunk) and event.frame_offset == 0:
            first_chunks.append(gate.wanted)  # engine thread: what the vocoder would see now
            if post:
                threading.Timer(POST_DELAY_S, gate.round_launched, args=(None,)).start()
        sink(event)

    engine = Engine(model, EngineConfig(max_running_requests=4, first_chunk_frames=2, chunk_frames=4,
                                        first_audio_hold_rows=hold_rows), on_event, gate)
    ids = [f"g{i}" for i in range(len(prompts))]
    engine.start()
    try:
        for i, rid in enumerate(ids):
            engine.submit(EngineRequest(rid, prompts[i], params[i]))
            if not together:
                sink.wait_finished([rid])
        sink.wait_finished(ids)
    finally:
        engine.shutdown(TIMEOUT_S)
    return sink, ids, engine.stats(), first_chunks


def test_light_load_holds_for_each_first_round_and_changes_no_frame(tiny_model, requests):
    prompts, params = requests
    sink, ids, stats, wanted = run(tiny_model, prompts, params, hold_rows=4, post=True, together=False)
    for rid, ref in zip(ids, generate(tiny_model, prompts, params)):
        assert_matches_reference(sink, rid, ref)
    assert stats.first_audio_holds == 3 and stats.first_audio_hold_timeouts == 0, stats
    assert wanted == [True] * 3  # the vocoder posts its rounds while a hold may wait for them
    # Each hold waited for the stand-in's post, not for less (a lower bound: the wait is deliberate).
    assert stats.first_audio_hold_ms >= 3 * POST_DELAY_S * 1000 * 0.9, stats


def test_without_a_post_each_hold_ends_at_the_timeout(tiny_model, requests):
    prompts, params = requests
    sink, ids, stats, _ = run(tiny_model, prompts, params, hold_rows=4, post=False, together=False)
    for rid, ref in zip(ids, generate(tiny_model, prompts, params)):
        assert_matches_reference(sink, rid, ref)
    assert stats.first_audio_holds == stats.first_audio_hold_timeouts == 3, stats


def test_above_the_hold_rows_the_gate_is_never_consulted(tiny_model, requests):
    prompts, params = requests
    sink, ids, stats, wanted = run(tiny_model, prompts, params, hold_rows=2, post=True, together=True)
    for rid, ref in zip(ids, generate(tiny_model, prompts, params)):
        assert_matches_reference(sink, rid, ref)
    assert stats.first_audio_holds == 0, stats  # 3 rows ran together from the first step
    assert wanted == [False] * 3  # under load the vocoder records no event for the gate
