"""How the backbone's KV cache stores a key or a value: in the model's dtype, in fp8 e4m3, or in
int8 with a scale per (token, KV head).

`kv_cache_dtype` (EngineConfig, the moss_tts parameter):
- "auto": the model's dtype (bf16 served), the exact cache;
- "fp8_e4m3": one byte an element, no scale (as vLLM's fp8 cache without calibrated scales):
  each value is clamped to +-448 (e4m3's largest finite; a plain cast would make it NaN) and
  rounded to nearest even once, when it is written. Readers widen it to the query's dtype on
  load. Why: a decode step at 256 slots reads ~8 GB of keys and values and its attention is
  bound by that read (issue 34); half the bytes, and twice the rows in the same memory;
- "int8": one byte an element and one fp32 scale per (token, KV head): a head's vector x is stored
  as q = floor(x * (127 / max|x|) + 0.5) (in [-127, 127]) with scale max|x| / 127, and read as
  q * scale. The same bytes as e4m3 plus 4 a head, with a uniform step of max|x| / 127 where
  e4m3 keeps 3 mantissa bits: on the real-size model in fp32 the hidden state's error from the
  cache alone was 0.038 against e4m3's 0.155 (bf16: 0.0099; perf/RESULTS.md, issue 34 round 25).
  Readers widen q exactly (|q| <= 127) and apply the scales to the scores (a key's) and to the
  softmax weights (a value's), not to the tiles: one multiply a key, not one an element.
Both byte formats are approximations: their measured effect is in perf/RESULTS.md (issue 34,
rounds 25-26).

A cache row (one token of one slot) is laid out as `row_elements` says: the heads' values, then
for int8 the heads' fp32 scales as 4 bytes each. The scales live inside the row so that every
copy of rows or blocks (prefix copies, a prefill's row copies) moves them with their values, and
a row of 8 heads x 128 stays 16-byte aligned (1,056 bytes). `split_rows` gives the two views a
kernel reads: values [..., kv_heads, d] and scales [..., kv_heads] (fp32, over the same bytes).

Writers: step_qkv's kernels (`cache_value`, `quantize_heads`), the engine's torch paths (`to_rows`).
Readers: decode_attention and prefill_attention's kernels, the torch paths (`from_cache`).
"""

from __future__ import annotations

import torch

from .triton_setup import INTERPRET, jit, tl

KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "int8")
# Triton compiles fp8 (e4m3) loads and conversions for sm89+ only (Ada, Hopper)
FP8_MIN_CAPABILITY = (8, 9)
FP8_E4M3_MAX = 448.0
INT8_MAX = 127.0
SCALE_DTYPE = torch.float32
_SCALE_BYTES = 4
# The interpreter's own fp32 -> fp8 cast does not round to nearest (Triton 3.6: often a step or
# more off), so under it `cache_value` rounds to the e4m3 grid itself first; compiled kernels use
# the hardware's conversion (round to nearest even).
_ROUND_E4M3 = tl.constexpr(INTERPRET) if tl is not None else INTERPRET
_MAX = tl.constexpr(FP8_E4M3_MAX) if tl is not None else FP8_E4M3_MAX  # a global a kernel may read
_QMAX = tl.constexpr(INT8_MAX) if tl is not None else INT8_MAX


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of the cache's buffers."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    return {"fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}.get(kv_cache_dtype, model_dtype)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == torch.float8_e4m3fn


def lacks_fp8(device: torch.device) -> bool:
    """True on a GPU whose kernels cannot load fp8 (below FP8_MIN_CAPABILITY): the engine's cache
    and the codec's rings refuse fp8 there when they are set up, naming their setting, instead of
    failing at the first graph capture."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY


def is_scaled(dtype: torch.dtype) -> bool:
    """A cache of this dtype keeps a scale per (token, KV head): int8."""
    return dtype == torch.int8


def row_elements(kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Elements of `dtype` a cache row (one token) takes: the heads' values, then int8's scales."""
    return kv_heads * head_dim + (kv_heads * _SCALE_BYTES if is_scaled(dtype) else 0)


def split_rows(rows: torch.Tensor, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Cache rows [..., row_elements] (the last dim contiguous) as views: the values [..., kv_heads,
    head_dim] and, for int8, the scales [..., kv_heads] in fp32 over the same bytes (else None)."""
    width = kv_heads * head_dim
    values = rows[..., :width].unflatten(-1, (kv_heads, head_dim))
    if not is_scaled(rows.dtype):
        return values, None
    return values, rows.view(SCALE_DTYPE)[..., width // _SCALE_BYTES:]


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] as int8 values [..., d] and fp32 scales [...] (the module's rule; a zero vector
    stores zeros with scale 0). In fp32, in the order quantize_heads computes it."""
    x = x.float()
    amax = x.abs().amax(-1)
    # a true division, as the kernel's div_rn (a scalar over a tensor would be a reciprocal, then a
    # multiply: two roundings), with the kernel's floor on the divisor
    inv = torch.where(amax > 0, torch.full_like(amax, INT8_MAX) / amax.clamp(min=1e-30), torch.zeros_like(amax))
    q = torch.floor(x * inv.unsqueeze(-1) + 0.5).clamp(-INT8_MAX, INT8_MAX)
    # tensor over tensor: CUDA's tensor over a scalar is a multiply by its reciprocal, a last bit
    # off the kernel's div_rn (a GPU test found the scales 1 ulp apart)
    return q.to(torch.int8), amax / torch.full_like(amax, INT8_MAX)


def to_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as the cache stores its values: itself in the model's dtype; clamped and rounded once in
    fp8. Not for int8, whose values need their scales: to_rows."""
    if is_scaled(dtype):
        raise TypeError("an int8 cache stores values with scales: kv_format.to_rows")
    if not is_fp8(dtype):
        return x.to(dtype)
    return x.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(dtype)


def to_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., kv_heads, head_dim] as cache rows [..., row_elements] of `dtype`: the bytes a write stores."""
    if not is_scaled(dtype):
        return to_cache(x, dtype).flatten(-2)
    values, scales = quantize(x)
    return torch.cat([values.flatten(-2), scales.contiguous().view(torch.int8)], dim=-1)


def scale_args(cache: torch.Tensor, kv_scales: tuple[torch.Tensor, torch.Tensor] | None) -> tuple:
    """What a kernel takes for kv_scales: (k_scale, v_scale, stride of a slot, stride of a row) of an
    int8 cache's scales [N, rows, kv_heads]; else the cache itself as pointers never read (the
    kernel's SCALED false) and zero strides."""
    if kv_scales is None:
        assert not is_scaled(cache.dtype), "an int8 cache's kernels need its scales (StaticKVCache.scales)"
        return cache, cache, 0, 0
    k_scale, v_scale = kv_scales
    assert k_scale.stride() == v_scale.stride() and k_scale.stride(2) == 1, "K and V scales laid out alike"
    return k_scale, v_scale, k_scale.stride(0), k_scale.stride(1)


def from_cache(x: torch.Tensor, dtype: torch.dtype, scales: torch.Tensor | None = None) -> torch.Tensor:
    """Cache values widened to the computation's dtype (a copy only when they differ); int8's times
    their scales [...] (one per head vector, x [..., d])."""
    if scales is not None:
        return (x.float() * scales.unsqueeze(-1)).to(dtype)
    return x if x.dtype == dtype else x.to(dtype)


def round_trip(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., kv_heads, head_dim] as a reader gets it back from a cache of `dtype`."""
    if x.dtype == dtype:
        return x
    if is_scaled(dtype):
        values, scales = quantize(x)
        return from_cache(values, x.dtype, scales)
    return from_cache(to_cache(x, dtype), x.dtype)


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
def quantize_heads(lo, hi):
    """Head vectors held as two fp32 halves [H, d/2] each -> int8 halves and fp32 scales [H]
    (quantize's rule and order of operations)."""
    amax = tl.maximum(tl.max(tl.abs(lo), 1), tl.max(tl.abs(hi), 1))
    # div_rn: a correctly rounded division, as quantize's (Triton's `/` is div.full, up to 2 ulp off)
    inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, _QMAX, tl.float32), tl.maximum(amax, 1e-30)), 0.0)
    q_lo = tl.clamp(tl.floor(lo * inv[:, None] + 0.5), -_QMAX, _QMAX).to(tl.int8)
    q_hi = tl.clamp(tl.floor(hi * inv[:, None] + 0.5), -_QMAX, _QMAX).to(tl.int8)
    return q_lo, q_hi, tl.math.div_rn(amax, tl.full(amax.shape, _QMAX, tl.float32))


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
