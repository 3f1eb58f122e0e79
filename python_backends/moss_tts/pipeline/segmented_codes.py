"""SegmentedCodes: a long text spoken as one stream, one engine request per segment.

The text is cut at sentence/clause boundaries (`text_segments.split_text`); the segments are
generated one after another and their code chunks come out as one sequence, so the stream keeps
one vocoder session and the listener hears one continuous utterance. Memory stays bounded: each
segment's engine row is freed when it ends, the vocoder's state is a fixed window.

The voice is kept by cloning: every segment gets the request's reference; without one, the
first segment's own first `VOICE_FRAMES` frames become the reference of the rest (the model
otherwise picks a new voice per segment). A continuation request continues its reference in
the first segment only; later ones clone it. Aborting (cancel, shutdown) stops the segment
running and starts no other. No Triton import.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator, Optional

import numpy as np

from ..contract.errors import InvalidRequest
from ..contract.tensors import N_VQ
from ..contract.text_segments import MAX_SEGMENT_CHARS, split_text
from .engine_codes import EngineCodes
from .stream_ports import CodesChunk
from .synthesis_request import SynthesisRequest

VOICE_FRAMES = 125  # 10 s of the first segment carry the voice into the others


class VoiceFrames:
    """The first `VOICE_FRAMES` code frames of a segment: the reference of the segments after it
    (long-form here, a text session's later requests in sessions/registry.py)."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self._num_frames = 0

    def add(self, codes: np.ndarray) -> None:
        if self._num_frames < VOICE_FRAMES and codes.shape[0]:
            self._parts.append(codes)
            self._num_frames += codes.shape[0]

    def codes(self) -> Optional[np.ndarray]:
        """[<= VOICE_FRAMES, 12], or None before any frame came."""
        return np.concatenate(self._parts)[:VOICE_FRAMES] if self._parts else None


class SegmentedCodes:
    def __init__(self, make_codes: Callable[[SynthesisRequest, Callable[[], Optional[np.ndarray]]], object],
                 synthesis: SynthesisRequest, segments: list[str],
                 reference_codes: Callable[[], Optional[np.ndarray]]) -> None:
        if len(segments) < 2:
            raise ValueError("SegmentedCodes is for two or more segments")
        self.make_codes = make_codes  # (segment request, reference) -> EngineCodes
        self.synthesis = synthesis
        self.segments = segments
        self.reference_codes = reference_codes
        self._current = None
        self._is_aborted = False

    def wake(self) -> None:
        current = self._current
        if current is not None:
            current.wake()

    def abort(self) -> None:
        self._is_aborted = True
        if self._current is not None:
            self._current.abort()

    def chunks(self) -> Iterator[Optional[CodesChunk]]:
        reference = self.reference_codes()
        reference = None if reference is None or not np.size(reference) else np.asarray(reference).reshape(-1, N_VQ)
        voice = VoiceFrames()  # the first segment's frames, when there is no reference
        for index, text in enumerate(self.segments):
            if self._is_aborted:
                return
            request = replace(self.synthesis, text=text, request_id=f"{self.synthesis.request_id}-s{index}",
                              mode=self.synthesis.mode if index == 0 else "clone")
            if index == 0 or reference is not None:
                given = reference
            else:
                given = voice.codes()
            self._current = self.make_codes(request, lambda given=given: given)
            for chunk in self._current.chunks():
                if isinstance(chunk, CodesChunk) and index == 0 and reference is None:
                    voice.add(chunk.codes)
                yield chunk


def codes_for(streams, builder, synthesis: SynthesisRequest, reference: Callable[[], Optional[np.ndarray]],
              max_segment_chars: int = MAX_SEGMENT_CHARS):
    """The codes source of one request: EngineCodes, or SegmentedCodes for a text longer than one
    segment (InvalidRequest for a duration that cannot apply to several segments)."""
    segments = split_text(synthesis.text, max_segment_chars)
    if len(segments) < 2:
        return EngineCodes(streams, builder, synthesis, reference)
    if synthesis.fields.tokens is not None:
        raise InvalidRequest(f"TOKENS sets the duration of one utterance, but this text is long-form ({len(segments)} "
                             f"segments of up to {max_segment_chars} characters): drop TOKENS or shorten the text")
    return SegmentedCodes(lambda request, ref: EngineCodes(streams, builder, request, ref), synthesis, segments,
                          reference)
