"""EngineStreams + EngineCodes: the engine behind per-request feeds, as the moss_tts model uses it
(CPU, tiny checkpoint, no Triton): chunks in order, refusals as ChildError kinds, waiting
ticks, abort on close, continuation context first."""

from __future__ import annotations

import time

import numpy as np
import pytest

from moss_tts.contract.errors import ChildError, ErrorKind
from moss_tts.engine import Engine, EngineConfig
from moss_tts.pipeline.engine_codes import EngineCodes
from moss_tts.pipeline.engine_streams import EngineStreams
from moss_tts.pipeline.synthesis_request import parse_synthesis_request


def synthesis(request_id, **values):
    values.setdefault("TEXT", "Hello there.")
    values.setdefault("SEED", 1)
    arrays = {k: np.array([v.encode() if isinstance(v, str) else v]) for k, v in values.items()}
    return parse_synthesis_request(lambda name: arrays.get(name), request_id)


@pytest.fixture
def streams(tiny_model):
    made = []

    def make(**config):
        s = EngineStreams(lambda on_event: Engine(tiny_model, EngineConfig(max_seq_len=512, **config), on_event))
        s.start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.shutdown(30)


def frames_of(chunks):
    return sum(c.codes.shape[0] for c in chunks if c is not None)


@pytest.mark.parametrize("host_turn_ms", [0, 20])
def test_chunks_arrive_in_order_and_end(streams, builder, host_turn_ms):
    s = streams(host_turn_ms=host_turn_ms)  # 20: each event waits for the engine's turn (host_turn.py)
    codes = EngineCodes(s, builder, synthesis("a", MAX_FRAMES=7, IGNORE_STOP=True, FIRST_CHUNK_FRAMES=2,
                                                CHUNK_FRAMES=3), lambda: None)
    chunks = [c for c in codes.chunks() if c is not None]
    assert [c.codes.shape for c in chunks] == [(2, 12), (3, 12), (2, 12)]
    assert all(c.codes.dtype == np.int32 and not c.context.size for c in chunks)
    assert s.num_in_flight == 0 and s.engine.stats().free_slots == s.engine.config.max_running_requests


def test_continuation_yields_its_context_first(streams, builder):
    ref = np.random.default_rng(0).integers(0, 1024, (1, 5, 12)).astype(np.int32)
    codes = EngineCodes(streams(), builder, synthesis("c", MAX_FRAMES=3, IGNORE_STOP=True, MODE="continuation",
                                                        REFERENCE_TEXT="It starts "), lambda: ref)
    first, *rest = [c for c in codes.chunks() if c is not None]
    assert first.codes.shape == (0, 12) and np.array_equal(first.context, ref[0])
    assert frames_of(rest) == 3


def test_closing_early_aborts_the_request(streams, builder):
    s = streams()
    codes = EngineCodes(s, builder, synthesis("x", MAX_FRAMES=400, IGNORE_STOP=True, FIRST_CHUNK_FRAMES=1),
                        lambda: None)
    chunks = codes.chunks()
    assert next(c for c in chunks if c is not None).codes.shape == (1, 12)
    chunks.close()
    deadline = time.monotonic() + 10
    while s.engine.stats().requests_cancelled == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = s.engine.stats()
    assert stats.requests_cancelled == 1 and stats.running == 0 and stats.frames_generated < 400


def test_a_waiting_request_yields_ticks(streams, builder):
    s = streams(max_running_requests=1)
    busy = EngineCodes(s, builder, synthesis("busy", MAX_FRAMES=300, IGNORE_STOP=True), lambda: None)
    busy_chunks = busy.chunks()
    next(c for c in busy_chunks if c is not None)
    waiting = EngineCodes(s, builder, synthesis("w", MAX_FRAMES=2, IGNORE_STOP=True), lambda: None, wait_s=0.05)
    chunks = waiting.chunks()
    assert next(chunks) is None  # queued behind "busy": a tick, so the stream can check cancellation
    chunks.close()
    busy_chunks.close()


@pytest.mark.parametrize("values, words", [
    (dict(MAX_FRAMES=5000), "input MAX_FRAMES 5000 does not fit"),  # max_seq_len is 512 here
    (dict(TOKENS=600), "input TOKENS 600 does not fit"),
    (dict(TEXT="word " * 600), "shorten the text"),  # the prompt alone is over 512 rows
])
def test_what_cannot_fit_is_refused_with_the_numbers(streams, builder, values, words):
    codes = EngineCodes(streams(), builder, synthesis("r", **values), lambda: None)
    with pytest.raises(ChildError) as info:
        next(codes.chunks())
    assert info.value.kind is ErrorKind.INVALID_ARGUMENT and words in str(info.value)
    assert "512" in str(info.value)


def test_the_default_length_is_what_fits(streams, builder):
    """No MAX_FRAMES: the default (4096) shrinks to the room max_seq_len leaves, so a long prompt
    is served instead of refused."""
    s = streams()
    request = synthesis("fit", IGNORE_STOP=True)
    chunks = [c for c in EngineCodes(s, builder, request, lambda: None).chunks() if c is not None]
    prompt_rows = builder.build(request.prompt_spec(None)).shape[0]
    assert sum(c.codes.shape[0] for c in chunks) == 512 - prompt_rows


def test_full_queue_is_unavailable(streams, builder):
    s = streams(max_running_requests=1, max_queue=1)
    held = [EngineCodes(s, builder, synthesis(f"h{i}", MAX_FRAMES=300, IGNORE_STOP=True), lambda: None).chunks()
            for i in range(2)]
    next(held[0])  # admitted
    next(held[1])  # queued (a chunk or a tick)
    with pytest.raises(ChildError) as info:
        next(EngineCodes(s, builder, synthesis("third", MAX_FRAMES=2), lambda: None).chunks())
    assert info.value.kind is ErrorKind.UNAVAILABLE and "busy" in str(info.value)
    for chunks in held:
        chunks.close()


def test_reference_errors_pass_through(streams, builder):
    def broken():
        raise ChildError("[INVALID_ARGUMENT] reference audio could not be decoded", ErrorKind.INVALID_ARGUMENT)

    with pytest.raises(ChildError, match="could not be decoded"):
        next(EngineCodes(streams(), builder, synthesis("ref"), broken).chunks())
