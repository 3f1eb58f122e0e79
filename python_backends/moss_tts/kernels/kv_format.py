"""How the backbone's KV cache stores a key or a value: in the model's dtype, or in fp8 e4m3.

`kv_cache_dtype` (EngineConfig, the moss_tts parameter):
- "auto": the model's dtype (bf16 served), the exact cache;
- "fp8_e4m3": one byte an element, no scale (as vLLM's fp8 cache without calibrated scales):
  each value is clamped to +-448 (e4m3's largest finite; a plain cast would make it NaN) and
  rounded to nearest even once, when it is written. Readers widen it to the query's dtype on
  load. Why: a decode step at 256 slots reads ~8 GB of keys and values and its attention is
  bound by that read (issue 34); half the bytes, and twice the rows in the same memory. An
  approximation: its measured effect is in perf/RESULTS.md (issue 34, round 25).

Writers: step_qkv's kernels (`cache_value`), the engine's torch paths (`to_cache`). Readers:
decode_attention and prefill_attention's kernels, the torch paths (`from_cache`).
"""

from __future__ import annotations

import torch

from .triton_setup import INTERPRET, jit, tl

KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
FP8_E4M3_MAX = 448.0
# The interpreter's own fp32 -> fp8 cast does not round to nearest (Triton 3.6: often a step or
# more off), so under it `cache_value` rounds to the e4m3 grid itself first; compiled kernels use
# the hardware's conversion (round to nearest even).
_ROUND_E4M3 = tl.constexpr(INTERPRET) if tl is not None else INTERPRET
_MAX = tl.constexpr(FP8_E4M3_MAX) if tl is not None else FP8_E4M3_MAX  # a global a kernel may read


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of the cache's buffers."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    return torch.float8_e4m3fn if kv_cache_dtype == "fp8_e4m3" else model_dtype


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == torch.float8_e4m3fn


def to_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as the cache stores it: itself in the model's dtype; clamped and rounded once in fp8."""
    if not is_fp8(dtype):
        return x.to(dtype)
    return x.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(dtype)


def from_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows widened to the computation's dtype (a copy only when they differ)."""
    return x if x.dtype == dtype else x.to(dtype)


@jit
def cache_value(x, cache_ptr):
    """A tile x as cache_ptr's buffer stores it (to_cache's rule); the dtype test is resolved
    when the kernel compiles, so a cache in the model's dtype costs nothing here."""
    dtype = cache_ptr.dtype.element_ty
    if dtype.is_fp8():
        x = tl.clamp(x.to(tl.float32), -_MAX, _MAX)
        if _ROUND_E4M3:
            x = _round_e4m3(x)
    return x.to(dtype)


@jit
def _round_e4m3(x):
    """fp32 x (|x| <= 448) rounded to nearest even on e4m3's grid: 3 mantissa bits, subnormal
    steps of 2^-9 below 2^-6. For the interpreter only (see _ROUND_E4M3)."""
    mag = tl.abs(x)
    exponent = tl.maximum(tl.floor(tl.log2(tl.maximum(mag, 1e-30))), -6.0)
    step = tl.exp2(exponent - 3.0)
    steps = mag / step
    whole = tl.floor(steps)
    frac = steps - whole
    is_odd = whole - 2.0 * tl.floor(whole * 0.5) == 1.0
    whole = tl.where((frac > 0.5) | ((frac == 0.5) & is_odd), whole + 1.0, whole)
    return tl.where(x < 0, -(whole * step), whole * step)
