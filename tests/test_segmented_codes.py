"""Long text as one stream of segments (no Triton): order, voice kept, abort, and with the engine."""

from __future__ import annotations

import numpy as np
import pytest

from moss_tts.contract.errors import InvalidRequest
from moss_tts.pipeline.segmented_codes import VOICE_FRAMES, SegmentedCodes, codes_for
from moss_tts.pipeline.stream_ports import AUDIO_READY, CodesChunk
from moss_tts.pipeline.synthesis_request import parse_synthesis_request

NO = np.zeros((0, 12), np.int32)


def synthesis(text, **values):
    arrays = {k: np.array([v.encode() if isinstance(v, str) else v]) for k, v in {"TEXT": text, **values}.items()}
    return parse_synthesis_request(lambda name: arrays.get(name), "long")


class FakeCodes:
    """A segment that yields `frames` frames in chunks of 2, the segment index in every code."""

    made = []

    def __init__(self, request, reference, frames=6):
        self.request, self.reference, self.frames, self.aborted = request, reference(), frames, False
        FakeCodes.made.append(self)

    def chunks(self):
        index = int(self.request.request_id.rsplit("-s", 1)[1])
        for _ in range(self.frames // 2):
            yield None  # a tick while waiting
            yield AUDIO_READY  # a vocoder call of the stream completed: passed through, not a chunk
            yield CodesChunk(np.full((2, 12), index, np.int32), NO)

    def abort(self):
        self.aborted = True


@pytest.fixture(autouse=True)
def fresh():
    FakeCodes.made = []


def test_segments_come_out_in_order_as_one_stream_and_keep_the_first_voice():
    codes = SegmentedCodes(FakeCodes, synthesis("x"), ["One.", "Two.", "Three."], lambda: None)
    frames = np.concatenate([c.codes for c in codes.chunks() if isinstance(c, CodesChunk)])
    assert frames[:, 0].tolist() == [0] * 6 + [1] * 6 + [2] * 6
    assert [m.request.text for m in FakeCodes.made] == ["One.", "Two.", "Three."]
    assert [m.request.request_id for m in FakeCodes.made] == ["long-s0", "long-s1", "long-s2"]
    assert FakeCodes.made[0].reference is None  # the model picks the voice once...
    for later in FakeCodes.made[1:]:  # ...and the first segment's frames carry it on
        assert np.array_equal(later.reference, np.zeros((6, 12), np.int32))
    assert VOICE_FRAMES == 125


def test_a_given_reference_serves_every_segment_and_continuation_only_the_first():
    ref = np.ones((4, 12), np.int32)
    codes = SegmentedCodes(FakeCodes, synthesis("x", MODE="continuation", REFERENCE_TEXT="r"), ["A.", "B."],
                           lambda: ref)
    list(codes.chunks())
    assert [m.request.mode for m in FakeCodes.made] == ["continuation", "clone"]
    assert all(np.array_equal(m.reference, ref) for m in FakeCodes.made)


def test_abort_stops_the_running_segment_and_starts_no_other():
    codes = SegmentedCodes(FakeCodes, synthesis("x"), ["A.", "B.", "C."], lambda: None)
    chunks = codes.chunks()
    next(c for c in chunks if isinstance(c, CodesChunk))
    codes.abort()
    rest = list(chunks)
    assert FakeCodes.made[0].aborted and len(FakeCodes.made) == 1 and len(rest) <= 9


def test_a_duration_cannot_apply_to_long_form():
    with pytest.raises(InvalidRequest, match="TOKENS sets the duration of one utterance"):
        codes_for(None, None, synthesis("One sentence here. " * 10, TOKENS=50), lambda: None, max_segment_chars=40)


def test_long_text_through_the_engine_frees_every_row(tiny_model, tiny_tokenizer):
    from moss_tts.engine.config import EngineConfig
    from moss_tts.engine.engine import Engine
    from moss_tts.model.processor import PromptBuilder
    from moss_tts.pipeline.engine_streams import EngineStreams

    streams = EngineStreams(lambda on_event: Engine(tiny_model, EngineConfig(max_seq_len=512), on_event))
    streams.start()
    try:
        builder = PromptBuilder(tiny_tokenizer, tiny_model.cfg)
        request = synthesis("First sentence is here. Second one follows it. Third closes the text.",
                            MAX_FRAMES=3, IGNORE_STOP=True, SEED=1)
        codes = codes_for(streams, builder, request, lambda: None, max_segment_chars=30)
        frames = sum(c.codes.shape[0] for c in codes.chunks() if c is not None)
        assert isinstance(codes, SegmentedCodes) and frames == 3 * len(codes.segments) == 9
        stats = streams.engine.stats()
        assert stats.running == 0 and stats.requests_finished == 3
    finally:
        streams.shutdown(10)
