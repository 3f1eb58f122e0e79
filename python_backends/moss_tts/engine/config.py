"""Engine configuration: one frozen dataclass, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import torch

from ..contract.parameters import config_fields
from ..kernels.kv_format import FP8_MIN_CAPABILITY, KV_CACHE_DTYPES, lacks_fp8

MAX_RUNNING_REQUESTS = 16
MAX_QUEUE = 256
MAX_SEQ_LEN = 4096 + 1024  # tokens per slot: prompt rows + generated frames
FIRST_CHUNK_FRAMES = 2  # 160 ms at 12.5 frames/s: small, for a short time to first audio
CHUNK_FRAMES = 10  # 800 ms at 12.5 frames/s
PREFILL_CHUNK_TOKENS = 2048
CUDA_GRAPH_MAX_BATCH = 256  # largest decode batch bucket captured (capped by max_running_requests)
CUDA_GRAPH_PREFILL_TOKENS = 512  # single-prompt prefills up to this many rows replay a graph
PREFIX_CACHE_ROWS = 8192  # prompt rows whose KV the prefix pool keeps (~1.2 GB on the real model)
PREFIX_BLOCK_ROWS = 16  # reuse granularity: a shared prefix is reused up to its last full block
MIN_KV_BUCKET = 256  # smallest attention window of a decode graph; windows double up to max_seq_len
GPU_MEMORY_UTILIZATION = 0.9  # share of the device this engine may fill (weights + KV + graphs)
ACTIVATION_RESERVE_GIB = 4.0  # graph pool and prefill activations, kept out of the KV budget

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineConfigError(ValueError):
    """An EngineConfig field is out of range; the message names the field."""


def _require_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineConfigError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")


def _require_non_negative(name: str, value, zero_means: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        meaning = f" (0 = {zero_means})" if zero_means else ""
        raise EngineConfigError(f"EngineConfig.{name} must be an integer >= 0{meaning}, got {value!r}")


@dataclass(frozen=True)
class EngineConfig:
    max_running_requests: int = MAX_RUNNING_REQUESTS
    max_queue: int = MAX_QUEUE
    max_seq_len: int = MAX_SEQ_LEN
    first_chunk_frames: int = FIRST_CHUNK_FRAMES
    chunk_frames: int = CHUNK_FRAMES
    # Chunks after the first: false = the frames sent so far plus the first chunk's (2, 4, 8, 10, ...),
    # true = the frames sent so far (2, 2, 4, 8, 10, ...: one chunk more, and the second chunk due
    # after 2 steps instead of 4, for the slow steps while a wave of streams is admitted; chunk_target).
    chunk_doubling: bool = False
    # A chunk leaves before its size, with the frames it has, when waiting one more step (as long
    # as the last) would make it leave later than this many ms before the audio already sent plays
    # out (counted from the stream's first chunk, 80 ms a frame); when it is already later, chunks
    # keep their sizes (an engine slower than real time gains nothing from smaller ones). For the
    # slow steps that admit a wave of streams. 0 = off: chunks leave at their size only.
    chunk_deadline_ms: int = 0
    # Prompt tokens prefilled per engine step: admission stops once a step's budget is used
    # (a longer prompt is still admitted alone) and one prefill forward covers at most this
    # many rows, so a burst of long prompts cannot stall the running streams for long.
    prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS
    # None = follow the model's parameters; when given, they must match the model.
    device: Optional[str] = None
    dtype: Optional[str] = None
    # GPU only (ignored on CPU, which always runs eagerly with exact shapes).
    enforce_eager: bool = False  # no CUDA graphs; shapes are still padded to buckets, so the
    # eager path computes exactly what the graphs compute (the debugging reference)
    fuse_kernels: bool = True  # torch.compile the pointwise chains (norms, RoPE, sampling)
    attention_kernel: bool = True  # decode attention by the Triton flash-decoding kernel, which
    # reads only each slot's own rows; false = masked SDPA over the whole window bucket
    sampler_kernel: bool = True  # each codebook's draw (penalty, top-k/top-p, Gumbel-max) as one
    # Triton kernel with the sort in registers; false = fused torch.compile kernels + torch.sort
    qkv_kernels: bool = True  # what a decode step does between a layer's qkv GEMM and its attention
    # (backbone: q/k norms, RoPE, the cache write; local frame: RoPE, cache write, attention) as one
    # Triton kernel each (kernels/step_qkv.py); false = the compiled kernels and index copies
    prefill_kernel: bool = True  # a batched prefill's layers write and read the KV slots in place: q/k norms,
    # RoPE and cache write (step_qkv.prefill_qkv), then attention (kernels/prefill_attention.py), one
    # Triton kernel each, and a step's prefix-pool copies in one launch (kernels/block_copy.py); false =
    # compiled norms, index copies, gathered windows repeated per head, masked SDPA, batched pool copies
    # Light load only: with at most this many running rows, a step that ends a new stream's first
    # chunk is completed before the next is launched, and the next waits on the device for the
    # in-process vocoder's round of that chunk, which then runs alone (first_audio_gate.py; needs
    # the Engine built with a first_audio_gate). 0 = never.
    first_audio_hold_rows: int = 0
    # The engine's host phase (applying a step, launching the next) goes first: its events are
    # delivered when it waits for the device, and a stream thread about to work waits while the
    # engine holds its turn, at most this many ms (host_turn.py). 0 = events at once, no waits.
    host_turn_ms: int = 0
    # While the turn delivers its held events, the process's GIL switch interval is widened to this
    # many µs, so the stream threads it wakes do not preempt the delivery (host_turn.py). 0 = never.
    host_turn_deliver_us: int = 0
    cuda_graph_max_batch: int = CUDA_GRAPH_MAX_BATCH
    cuda_graph_prefill_tokens: int = CUDA_GRAPH_PREFILL_TOKENS  # 0 = no prefill graphs
    min_kv_bucket: int = MIN_KV_BUCKET
    # Prefix reuse: prompts that start like an earlier one (same speaker reference, same
    # instruction block) copy that prefix's keys/values from a pool instead of prefilling it.
    # 0 = off. The pool is part of the KV memory budget.
    prefix_cache_rows: int = PREFIX_CACHE_ROWS
    prefix_block_rows: int = PREFIX_BLOCK_ROWS
    # Memory budget: weights + KV cache + ACTIVATION_RESERVE_GIB must fit in
    # gpu_memory_utilization x device memory, less reserved_memory_gib for colocated stages
    # (vocoder, reference encoder). setup() raises with the numbers when it does not.
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    reserved_memory_gib: float = 0.0
    # How the backbone's KV cache stores keys and values (kernels/kv_format.py): "auto" = the
    # model's dtype (exact); "fp8_e4m3" = one byte each, clamped to +-448 and rounded once;
    # "int8" = one byte each and an fp32 scale per (token, KV head). Both are approximations:
    # about half the bytes a decode step's attention reads, about twice the rows per GiB.
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "max_queue", "max_seq_len", "first_chunk_frames",
                     "chunk_frames", "prefill_chunk_tokens", "cuda_graph_max_batch", "min_kv_bucket"):
            _require_positive(name, getattr(self, name))
        _require_non_negative("cuda_graph_prefill_tokens", self.cuda_graph_prefill_tokens)
        _require_non_negative("first_audio_hold_rows", self.first_audio_hold_rows, "never")
        _require_non_negative("host_turn_ms", self.host_turn_ms, "off")
        _require_non_negative("host_turn_deliver_us", self.host_turn_deliver_us, "never")
        _require_non_negative("chunk_deadline_ms", self.chunk_deadline_ms, "off")
        _require_non_negative("prefix_cache_rows", self.prefix_cache_rows, "no prefix reuse")
        _require_positive("prefix_block_rows", self.prefix_block_rows)
        if 0 < self.prefix_cache_rows < self.prefix_block_rows:
            raise EngineConfigError(f"EngineConfig.prefix_cache_rows ({self.prefix_cache_rows}) must be 0 "
                                    f"or at least prefix_block_rows ({self.prefix_block_rows})")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise EngineConfigError(f"EngineConfig.gpu_memory_utilization must be in (0, 1], "
                                    f"got {self.gpu_memory_utilization!r}")
        if not self.reserved_memory_gib >= 0.0:
            raise EngineConfigError(f"EngineConfig.reserved_memory_gib must be >= 0, "
                                    f"got {self.reserved_memory_gib!r}")
        if self.max_seq_len < 2:
            raise EngineConfigError(f"EngineConfig.max_seq_len must be >= 2 (one prompt row and one "
                                    f"frame), got {self.max_seq_len}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise EngineConfigError(f"EngineConfig.kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, "
                                    f"got {self.kv_cache_dtype!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise EngineConfigError(f"EngineConfig.dtype must be one of {sorted(DTYPES)} or None, "
                                    f"got {self.dtype!r}")
        if self.device is not None:
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError) as exc:
                raise EngineConfigError(f"EngineConfig.device {self.device!r} is not a torch device "
                                        f"({exc})") from None

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> "EngineConfig":
        """Triton pbtxt `parameters` (all strings) -> config; keys that are no field are skipped
        (device and dtype are the adapter's), a value that does not parse names its key."""
        try:
            values = config_fields(cls, parameters, skip=("device", "dtype"))
        except ValueError as exc:
            raise EngineConfigError(str(exc)) from None
        return cls(**values)

    @property
    def prefix_blocks(self) -> int:
        return self.prefix_cache_rows // self.prefix_block_rows

    @property
    def torch_dtype(self) -> Optional[torch.dtype]:
        return None if self.dtype is None else DTYPES[self.dtype]

    def check_model(self, device: torch.device, dtype: torch.dtype, max_positions: int) -> None:
        """Raise if this config contradicts the loaded model (the engine never moves it)."""
        wanted = None if self.device is None else torch.device(self.device)
        # "cuda" matches the model on any cuda index; "cuda:1" only cuda:1.
        if wanted is not None and (wanted.type != device.type
                                   or wanted.index not in (None, device.index)):
            raise EngineConfigError(f"EngineConfig.device={self.device!r} but the model is on "
                                    f"{device}: load the model there or leave device unset")
        if self.dtype is not None and self.torch_dtype != dtype:
            raise EngineConfigError(f"EngineConfig.dtype={self.dtype!r} but the model is {dtype}: "
                                    f"load the model in that dtype or leave dtype unset")
        if self.max_seq_len > max_positions:
            raise EngineConfigError(f"EngineConfig.max_seq_len={self.max_seq_len} exceeds the model's "
                                    f"max_position_embeddings ({max_positions})")
        if self.kv_cache_dtype == "fp8_e4m3" and lacks_fp8(device):
            raise EngineConfigError(f"EngineConfig.kv_cache_dtype='fp8_e4m3' needs a GPU of compute capability "
                                    f"{FP8_MIN_CAPABILITY} or newer (Ada, Hopper); {device} is "
                                    f"{torch.cuda.get_device_capability(device)}: use kv_cache_dtype='auto'")
