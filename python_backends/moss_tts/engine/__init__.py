"""Continuous-batching engine for MOSS-TTS-Local: requests in, streamed frame codes out.

Layout (one noun per file): config (EngineConfig), request (EngineRequest + RequestState),
events (CodesChunk, Finished), scheduler (policy, no tensors), kv_cache (static slot-major
cache), slot_sampling (per-slot sampling state), backbone (layer walk over the cache),
runner (owns the tensors), stats, engine (the thread that ties them together).

Request lifecycle:
1. Engine.submit validates the request against the model and EngineConfig (ValueError),
   then queues it (QueueFull beyond max_queue).
2. At a step boundary the scheduler admits it (FIFO, free slot, prefill token budget);
   the runner takes a KV slot, resets the slot's sampling state and prefills the prompt.
3. Every step samples one frame for each running request and feeds it back through the
   backbone at the request's own position; frames leave as CodesChunk events
   (first_chunk_frames, then every chunk_frames).
4. Stop, max_frames, abort (at the next boundary), an error in its step or shutdown end
   it: the remainder chunk (not after a cancel), the slot freed, then one Finished.
"""

from .config import EngineConfig, EngineConfigError
from .engine import Engine, EngineClosed
from .events import CodesChunk, EngineEvent, Finished, FinishReason
from .request import EngineRequest, chunk_target
from .scheduler import QueueFull
from .stats import EngineStats

__all__ = [
    "CodesChunk", "Engine", "EngineClosed", "EngineConfig", "EngineConfigError", "EngineEvent",
    "EngineRequest", "EngineStats", "Finished", "FinishReason", "QueueFull", "chunk_target",
]
