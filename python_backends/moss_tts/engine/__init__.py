"""Continuous-batching engine for MOSS-TTS-Local: requests in, streamed frame codes out.

Layout (one noun per file): config (EngineConfig), request (EngineRequest + RequestState),
events (CodesChunk, Finished), scheduler (policy, no tensors), cache_manager (the scheduler's
slot, length and prefix-block decisions), prefix_cache (which prompt blocks the pool holds),
buckets (shape policy), kv_cache (static slot-major buffers and copies), slot_state (per-slot
device state), memory (budget), fused (pointwise chains, compiled on a GPU), backbone (layer
walk over the cache), frame (local transformer + sampling), step (the two step functions),
graph_runner (CUDA graphs), runner (owns the tensors, launches steps), stats, engine (the
thread that ties them together).

Request lifecycle:
1. Engine.submit validates the request against the model and EngineConfig (ValueError),
   then queues it (QueueFull beyond max_queue).
2. At a step boundary the scheduler admits it (FIFO, free slot, prefill token budget) and
   its CacheManager gives it a KV slot and the prefix pool blocks it can reuse; the engine
   stages the prompt with the runner (stage_prompt).
3. The next step (the CacheManager's StepPlan, run by ModelRunner.run_step) launches the
   staged prompts' prefix copies and batched prefill, which writes their KV rows,
   assigns their slots' sampling state and samples frame 0, then one decode step over every
   running slot (frame 1 for the new ones): feed back the last frame at the slot's own
   position, sample the next. On a GPU both replay CUDA graphs where the shape has one.
4. The host reads a step's single output copy after launching the next step (overlap);
   frames leave as CodesChunk events (first_chunk_frames, then every chunk_frames).
5. Stop, max_frames, abort (at the next boundary), an error in its step or shutdown end
   it: the remainder chunk (not after a cancel), the slot freed (and marked idle on the
   device), then one Finished. Frames a request's last in-flight step made are dropped.
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
