"""The codec's Triton kernels compile for the H200 (sm_90) on a machine without a GPU.

The interpreter tests (test_window_attention.py) check what the kernels compute, but the
interpreter runs their Python: a construct that only the compiler refuses (a type that does not
unify across a loop, a scalar where a block is needed) would pass them and fail at the server's
first graph capture. GPU time is scarce, so each code path of the codec's launches is compiled to a
cubin here with Triton's own ptxas.
"""

from __future__ import annotations

import importlib.util

import pytest

from moss_tts.kernels import window_attention as wa

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

H200 = (90, 32)  # compute capability, warp size


def compile_for_h200(fn, signature: dict, constants: dict, num_warps: int, num_stages: int) -> bytes:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **{name: "constexpr" for name in constants}}
    try:
        kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                                target=GPUTarget("cuda", *H200), options={"num_warps": num_warps, "num_stages": num_stages})
    except RuntimeError as exc:
        if "ptxas" in str(exc) and "not found" in str(exc):  # a triton build without the CUDA toolchain
            pytest.skip(f"this triton cannot compile for CUDA here: {exc}")
        raise
    return kernel.asm["cubin"]


def attention_signature(dtype: str) -> dict:
    tensor, index = f"*{dtype}", "*i64"
    return {"qkv_ptr": tensor, "cos_ptr": "*fp32", "sin_ptr": "*fp32", "k_ring_ptr": tensor, "v_ring_ptr": tensor,
            "rows_ptr": index, "offsets_ptr": index, "starts_ptr": index, "lengths_ptr": index, "out_ptr": tensor,
            "T_max": "i32", "H": "i32", "W": "i32",
            **{name: "i32" for name in ("stride_n", "stride_t", "stride_rn", "stride_rt", "stride_rs", "stride_rh",
                                        "stride_rw", "stride_on", "stride_ot")}, "qk_scale": "fp32"}


# Each compile takes ~5 s on the 2-core CI machine, so the cases are the distinct code paths: both
# loop forms of the streaming layouts (small tiles: two loops; 64-query tiles: one loop), the
# offline form, bf16 (served) and once fp32 (the codec's CPU-checkpoint dtype on a GPU).
ATTENTION_CASES = [("offline", 64, "bf16"), ("batched", 16, "bf16"), ("batched", 64, "bf16"), ("packed", 16, "bf16"),
                   ("packed", 64, "bf16"), ("packed", 64, "fp32")]


@pytest.mark.parametrize("layout, tokens, dtype", ATTENTION_CASES)
def test_attention_kernel_compiles_for_the_h200(layout, tokens, dtype):
    config = wa.attention_config(tokens)
    one_loop = config.one_loop and layout != "offline"  # one loop over ring and chunk: streaming only
    constants = {"HAS_RING": layout != "offline", "PACKED": layout == "packed", "HEAD_DIM": 64,
                 "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "ONE_LOOP": one_loop}
    assert compile_for_h200(wa._attention_kernel, attention_signature(dtype), constants, config.num_warps,
                            config.num_stages)


@pytest.mark.parametrize("packed", [False, True])
def test_ring_write_kernel_compiles_for_the_h200(packed):
    dtype = "bf16"
    signature = {name: kind for name, kind in attention_signature(dtype).items()
                 if name not in ("out_ptr", "T_max", "stride_on", "stride_ot", "qk_scale")}
    signature = {**signature, "T_max": "i32", "kept_max": "i32"}
    order = ("qkv_ptr", "cos_ptr", "sin_ptr", "k_ring_ptr", "v_ring_ptr", "rows_ptr", "offsets_ptr", "starts_ptr",
             "lengths_ptr", "T_max", "kept_max", "H", "W", "stride_n", "stride_t", "stride_rn", "stride_rt",
             "stride_rs", "stride_rh", "stride_rw")
    assert compile_for_h200(wa._ring_write_kernel, {name: signature[name] for name in order},
                            {"PACKED": packed, "HEAD_DIM": 64, "BLOCK_T": wa.RING_WRITE_BLOCK_T}, wa.NUM_WARPS, 2)
