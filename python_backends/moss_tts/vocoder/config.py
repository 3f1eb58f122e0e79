"""The vocoder's configuration: `VocoderConfig`, the codec decode's sizes (a vocoder model's pbtxt
parameters, or what moss_tts sets for its in-process worker), and `VocoderPlacement`, where moss_tts
decodes its audio (its pbtxt parameters of these names). Each is validated once, at load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..codec.transformer import (DEFAULT_FUSION, DEFAULT_RING_DTYPE, DEFAULT_RING_KERNEL, FUSIONS, RING_DTYPES,
                                 RING_KERNELS, check_small_gemm_rows)
from ..contract.parameters import config_fields, parse_parameter

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class NoFreeSlot(RuntimeError):
    """Every vocoder slot (or every public one) holds an active sequence."""


@dataclass(frozen=True)
class VocoderConfig:
    max_slots: int = 16
    n_vq: int = 12
    device: str = "cpu"
    dtype: str = "float32"  # a key of DTYPES (a torch.dtype is accepted and stored by name)
    max_public_sessions: int = 16  # slots open to callers other than the moss_tts entry
    cuda_graphs: bool = False  # replay CUDA graphs for chunks of up to max_graph_frames (GPU only)
    # Codec frames per graphed step; the pipeline's chunks are 2, 10, then the rest, and longer
    # chunks are decoded in pieces of this many.
    max_graph_frames: int = 10
    # Rows per codec call: a larger group is decoded in pieces of this many. The state is read in
    # place, so a bigger step costs only activations (the pool: ~2 GiB at 256 x 10 on the real
    # codec) and gains throughput up to ~256 rows on the H200 (perf/bench_vocoder.py).
    max_step_rows: int = 256

    def __post_init__(self):
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"VocoderConfig.cuda_graphs must be a bool, got {self.cuda_graphs!r}")
        for name in ("max_slots", "n_vq", "max_public_sessions", "max_graph_frames", "max_step_rows"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"VocoderConfig.{name} must be a positive integer, got {value!r}")
        if isinstance(self.dtype, torch.dtype):
            object.__setattr__(self, "dtype", str(self.dtype).removeprefix("torch."))
        if self.dtype not in DTYPES:
            raise ValueError(f"VocoderConfig.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"VocoderConfig.device {self.device!r} is not a torch device ({exc})") from None

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str], **adapter) -> "VocoderConfig":
        """Triton pbtxt `parameters` (all strings) -> config. `adapter` holds what the model sets
        itself (max_slots from max_batch_size, device, dtype) and defaults a parameter overrides."""
        return cls(**{**adapter, **config_fields(cls, parameters, skip=("max_slots", "n_vq", "device", "dtype"))})

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


PLACEMENTS = ("in_process", "bls")
VOCODER_STREAMS = ("own", "engine")


def codec_fusion(parameters: Mapping[str, str]) -> str:
    """The vocoder model's `fusion` parameter (codec.transformer.FUSIONS; absent: the default
    moss_tts's in-process vocoder serves too), checked."""
    return _checked_fusion("vocoder parameter fusion", parameters.get("fusion") or DEFAULT_FUSION)


def _checked_fusion(parameter: str, fusion: str) -> str:
    if fusion not in FUSIONS:
        raise ValueError(f"{parameter} must be one of {', '.join(FUSIONS)}, got {fusion!r}")
    return fusion


def codec_ring_kernel(parameters: Mapping[str, str]) -> str:
    """The vocoder model's `ring_kernel` parameter (codec.transformer.RING_KERNELS; absent: the
    default moss_tts's in-process vocoder serves too), checked."""
    return _checked_ring_kernel("vocoder parameter ring_kernel", parameters.get("ring_kernel") or DEFAULT_RING_KERNEL)


def codec_small_gemm_rows(parameters: Mapping[str, str]) -> int:
    """The vocoder model's `small_gemm_rows` parameter (TransformerLayer.small_gemm_; absent: 0,
    off), checked."""
    name = "small_gemm_rows"
    rows = parse_parameter(name, parameters[name], "int") if parameters.get(name) else 0
    return check_small_gemm_rows(rows, f"vocoder parameter {name}")


def codec_ring_dtype(parameters: Mapping[str, str]) -> str:
    """The vocoder model's `ring_dtype` parameter (codec.transformer.RING_DTYPES; absent: the
    default, the codec's own dtype), checked."""
    return _checked_ring_dtype("vocoder parameter ring_dtype", parameters.get("ring_dtype") or DEFAULT_RING_DTYPE)


def _checked_ring_dtype(parameter: str, ring_dtype: str) -> str:
    if ring_dtype not in RING_DTYPES:
        raise ValueError(f"{parameter} must be one of {', '.join(RING_DTYPES)}, got {ring_dtype!r}")
    return ring_dtype


def _checked_ring_kernel(parameter: str, ring_kernel: str) -> str:
    if ring_kernel not in RING_KERNELS:
        raise ValueError(f"{parameter} must be one of {', '.join(RING_KERNELS)}, got {ring_kernel!r}")
    return ring_kernel


@dataclass(frozen=True)
class VocoderPlacement:
    """Where `moss_tts` decodes its audio (its pbtxt parameters of these names)."""
    vocoder: str = "in_process"  # or "bls": the `vocoder` model, over BLS (split placements)
    vocoder_device: str = "auto"  # in_process: "auto" = the engine's device, or "cuda:N" / "cpu"
    vocoder_slots: int = 0  # in_process: sequences at once; 0 = the model's max_streams
    vocoder_step_rows: int = 256  # in_process: rows per codec step (graph buckets up to this)
    vocoder_idle_s: float = 60.0  # in_process: a sequence without a call this long is ended
    # in_process: sequences per round, the most urgent first (0 = vocoder_step_rows). Shorter
    # rounds let a new stream's chunks in sooner; each round is still one wide step.
    vocoder_round_rows: int = 128
    # in_process: a round of fewer frames waits for more while none of its chunks is due within
    # vocoder_hold_ms (0 = rounds launch at once): each round has a fixed GPU cost beside the
    # engine's steps (vocoder/jobs.hold_until).
    vocoder_round_min_frames: int = 256
    vocoder_hold_ms: float = 250.0
    # in_process: with at least vocoder_load_streams sequences open, a small round waits until
    # its oldest chunk has queued vocoder_load_hold_ms even when some of it is due now (a first
    # chunk): fewer, larger rounds under load, for that much first audio (jobs.LoadHold; 0 = off).
    vocoder_load_streams: int = 32
    vocoder_load_hold_ms: float = 0.0
    # in_process: how the codec's LayerNorms and GELU run on the GPU (codec.transformer.FUSIONS):
    # "none" torch's kernels; "ln" the one-pass norm kernel; "lt_gelu" the GELU (tanh) in
    # cuBLASLt's epilogue; "ln_lt_gelu" both; "gelu", "norm_gelu" the Triton GEMM's fusions.
    vocoder_fusion: str = DEFAULT_FUSION
    # in_process: how the codec's streaming attention runs its RoPE, attention and ring write
    # (codec.transformer.RING_KERNELS): "split" three kernels a layer, "fused" one.
    vocoder_ring_kernel: str = DEFAULT_RING_KERNEL
    # in_process: how the decode state's rings store keys and values (codec.transformer.RING_DTYPES):
    # "auto" the codec's dtype; "fp8_e4m3" one byte each (an approximation, opt-in; sm89+ on a GPU).
    vocoder_ring_dtype: str = DEFAULT_RING_DTYPE
    # in_process on a GPU: codec steps of at most this many tokens at a stage run each layer's
    # GEMMs as four Triton kernels with the norms, GELU and residual adds inside (codec.transformer,
    # TransformerLayer.small_gemm_): fewer graph nodes where the GEMMs are latency-bound. 0 = off.
    vocoder_small_gemm_rows: int = 0
    # in_process on a GPU: "own" = the vocoder's rounds on a CUDA stream of their own, beside the
    # engine's steps (concurrent); "engine" = on the engine's stream, between its steps (serial):
    # small rounds' ~1,100 kernels then never interleave with a step's (issue 34, round 11). Two
    # streams did more of both than one at every round size on the H200 (round 12).
    vocoder_stream: str = "own"
    # in_process: the engine's thread hands a plain streamed request's chunks to the vocoder as it
    # delivers them (pipeline/chunk_forwarder.py); the stream thread wakes only to send audio.
    vocoder_forward_chunks: bool = False

    def __post_init__(self):
        _checked_fusion("parameter vocoder_fusion", self.vocoder_fusion)
        _checked_ring_kernel("parameter vocoder_ring_kernel", self.vocoder_ring_kernel)
        _checked_ring_dtype("parameter vocoder_ring_dtype", self.vocoder_ring_dtype)
        check_small_gemm_rows(self.vocoder_small_gemm_rows, "parameter vocoder_small_gemm_rows")
        if self.vocoder_stream not in VOCODER_STREAMS:
            raise ValueError(f"parameter vocoder_stream must be one of {', '.join(VOCODER_STREAMS)}, "
                             f"got {self.vocoder_stream!r}")
        if self.vocoder not in PLACEMENTS:
            raise ValueError(f"parameter vocoder must be one of {', '.join(PLACEMENTS)}, got {self.vocoder!r}")
        if self.vocoder_slots < 0 or self.vocoder_step_rows < 1 or not self.vocoder_idle_s > 0 \
                or self.vocoder_round_rows < 0 or self.vocoder_round_min_frames < 0 or not self.vocoder_hold_ms >= 0:
            raise ValueError(f"vocoder_slots must be >= 0 (0 = max_streams), vocoder_step_rows >= 1, "
                             f"vocoder_idle_s > 0, vocoder_round_rows, vocoder_round_min_frames and "
                             f"vocoder_hold_ms >= 0; got {self.vocoder_slots}, {self.vocoder_step_rows}, "
                             f"{self.vocoder_idle_s}, {self.vocoder_round_rows}, {self.vocoder_round_min_frames}, "
                             f"{self.vocoder_hold_ms}")
        if self.vocoder_load_streams < 0 or not self.vocoder_load_hold_ms >= 0:
            raise ValueError(f"vocoder_load_streams and vocoder_load_hold_ms must be >= 0; got "
                             f"{self.vocoder_load_streams}, {self.vocoder_load_hold_ms}")

    @classmethod
    def from_parameters(cls, parameters) -> "VocoderPlacement":
        strings = {k: parameters[k] for k in ("vocoder", "vocoder_device", "vocoder_fusion", "vocoder_ring_kernel",
                                              "vocoder_ring_dtype", "vocoder_stream") if k in parameters}
        return cls(**{**config_fields(cls, parameters, skip=tuple(strings)), **strings})

    @property
    def codec_form(self) -> tuple[str, str, int, str]:
        """MossAudioCodec.serving_form_'s arguments for the in-process vocoder's codec."""
        return self.vocoder_fusion, self.vocoder_ring_kernel, self.vocoder_small_gemm_rows, self.vocoder_ring_dtype

    @property
    def is_in_process(self) -> bool:
        return self.vocoder == "in_process"
