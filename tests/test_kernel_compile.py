"""The Triton kernels of the codec and of the engine step compile for the H200 (sm_90) on a machine without a GPU.

The interpreter tests (test_window_attention.py) check what the kernels compute, but the
interpreter runs their Python: a construct that only the compiler refuses (a type that does not
unify across a loop, a scalar where a block is needed) would pass them and fail at the server's
first graph capture. GPU time is scarce, so each code path of the codec's launches is compiled to a
cubin here with Triton's own ptxas. For the fused-linear GEMM, ptxas's report is checked too: each
tile of its table compiles without spills and without serialized wgmma (its table is chosen so).
"""

from __future__ import annotations

import importlib.util

import pytest

from moss_tts.kernels import block_copy as bc
from moss_tts.kernels import fused_linear as fl
from moss_tts.kernels import fused_window_attention as fwa
from moss_tts.kernels import gated_silu as gs
from moss_tts.kernels import layer_norm as ln
from moss_tts.kernels import prefill_attention as pa
from moss_tts.kernels import step_qkv as sq
from moss_tts.kernels import window_attention as wa

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

H200 = (90, 32)  # compute capability, warp size


def compile_for_h200(fn, signature: dict, constants: dict, num_warps: int, num_stages: int,
                     divisible: tuple[str, ...] = ()):
    """The compiled kernel (asm["cubin"], asm["ptx"], ...). `divisible`: arguments that a launch
    sees as multiples of 16 (Triton specializes them so; it decides vector widths and pipelining)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **{name: "constexpr" for name in constants}}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    try:
        kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs),
                                target=GPUTarget("cuda", *H200), options={"num_warps": num_warps, "num_stages": num_stages})
    except RuntimeError as exc:
        if "ptxas" in str(exc) and "not found" in str(exc):  # a triton build without the CUDA toolchain
            pytest.skip(f"this triton cannot compile for CUDA here: {exc}")
        raise
    return kernel


def attention_signature(dtype: str) -> dict:
    tensor, index = f"*{dtype}", "*i64"
    return {"qkv_ptr": tensor, "k_ring_ptr": tensor, "v_ring_ptr": tensor, "rows_ptr": index, "offsets_ptr": index,
            "starts_ptr": index, "lengths_ptr": index, "out_ptr": tensor, "T_max": "i32", "H": "i32", "W": "i32",
            **{name: "i32" for name in ("stride_n", "stride_t", "stride_rs", "stride_rh", "stride_rw", "stride_on",
                                        "stride_ot")}, "qk_scale": "fp32"}


# Each compile takes ~5 s on the 2-core CI machine, so the cases are the distinct code paths: the
# streaming layouts at both tile sizes attention_config picks (16 queries x 64 keys, 2 warps; 64
# queries x 32 keys, 4 warps, 3 stages), the offline form, bf16 (served) and once fp32 (the
# codec's CPU-checkpoint dtype on a GPU).
ATTENTION_CASES = [("offline", 64, "bf16"), ("batched", 16, "bf16"), ("batched", 64, "bf16"), ("packed", 16, "bf16"),
                   ("packed", 64, "bf16"), ("packed", 64, "fp32")]


@pytest.mark.parametrize("layout, tokens, dtype", ATTENTION_CASES)
def test_attention_kernel_compiles_for_the_h200(layout, tokens, dtype):
    config = wa.attention_config(tokens)
    constants = {"HAS_RING": layout != "offline", "PACKED": layout == "packed", "HEAD_DIM": 64,
                 "BLOCK_M": config.block_m, "BLOCK_N": config.block_n}
    assert compile_for_h200(wa._attention_kernel, attention_signature(dtype), constants, config.num_warps,
                            config.num_stages).asm["cubin"]


def fused_ring_signature(dtype: str) -> dict:
    tensor, index, table = f"*{dtype}", "*i64", "*fp32"
    return {"qkv_ptr": tensor, "cos_ptr": table, "sin_ptr": table, "k_ring_ptr": tensor, "v_ring_ptr": tensor,
            "rows_ptr": index, "offsets_ptr": index, "starts_ptr": index, "lengths_ptr": index, "out_ptr": tensor,
            **{name: "i32" for name in ("T_max", "H", "W", "stride_n", "stride_t", "stride_rn", "stride_rt", "stride_rs",
                                        "stride_rh", "stride_rw", "stride_on", "stride_ot")}, "qk_scale": "fp32"}


@pytest.mark.parametrize("layout, tokens, dtype", [case for case in ATTENTION_CASES if case[0] != "offline"])
def test_fused_ring_kernel_compiles_for_the_h200(layout, tokens, dtype):
    """The fused streaming kernel at attention_config's tiles, with its two barriers (the RoPE's
    stores before the attention's loads, the attention's loads before the ring write): the
    split attention kernel's TTIR has none, so these are the kernel's own."""
    config = wa.attention_config(tokens)
    constants = {"PACKED": layout == "packed", "HEAD_DIM": 64, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                 "BLOCK_T": wa.ROPE_BLOCK_T}
    kernel = compile_for_h200(fwa._fused_ring_kernel, fused_ring_signature(dtype), constants, config.num_warps,
                              config.num_stages)
    assert kernel.asm["cubin"] and kernel.asm["ttir"].count("gpu.barrier") == 2


@pytest.mark.parametrize("packed", [False, True])
def test_ring_write_kernel_compiles_for_the_h200(packed):
    dtype = "bf16"
    signature = {name: kind for name, kind in attention_signature(dtype).items()
                 if name not in ("out_ptr", "T_max", "stride_on", "stride_ot", "qk_scale")}
    signature = {**signature, "T_max": "i32", "kept_max": "i32"}
    order = ("qkv_ptr", "k_ring_ptr", "v_ring_ptr", "rows_ptr", "offsets_ptr", "starts_ptr", "lengths_ptr", "T_max",
             "kept_max", "H", "W", "stride_n", "stride_t", "stride_rs", "stride_rh", "stride_rw")
    kernel = compile_for_h200(wa._ring_write_kernel, {name: signature[name] for name in order},
                              {"PACKED": packed, "HEAD_DIM": 64, "BLOCK_T": wa.ROPE_BLOCK_T}, wa.NUM_WARPS, 2)
    assert kernel.asm["cubin"]


@pytest.mark.parametrize("tokens", [16, 64])
def test_fp8_ring_kernels_compile_for_the_h200(tokens):
    """The codec's streaming kernels over fp8 rings (codec.transformer.RING_DTYPES), packed, bf16
    activations: the attention (each tile's keys from two sources of two types), the ring write
    (kv_format's clamp), and the fused kernel."""
    config = wa.attention_config(tokens)
    fp8 = {"k_ring_ptr": "*fp8e4nv", "v_ring_ptr": "*fp8e4nv"}
    constants = {"HAS_RING": True, "PACKED": True, "HEAD_DIM": 64, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n}
    assert compile_for_h200(wa._attention_kernel, {**attention_signature("bf16"), **fp8}, constants, config.num_warps,
                            config.num_stages).asm["cubin"]
    constants = {"PACKED": True, "HEAD_DIM": 64, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                 "BLOCK_T": wa.ROPE_BLOCK_T}
    assert compile_for_h200(fwa._fused_ring_kernel, {**fused_ring_signature("bf16"), **fp8}, constants,
                            config.num_warps, config.num_stages).asm["cubin"]
    signature = {name: kind for name, kind in {**attention_signature("bf16"), **fp8}.items()
                 if name not in ("out_ptr", "T_max", "stride_on", "stride_ot", "qk_scale")}
    signature = {**signature, "T_max": "i32", "kept_max": "i32"}
    signature = {name: signature[name] for name in wa._ring_write_kernel.arg_names if name in signature}
    assert compile_for_h200(wa._ring_write_kernel, signature, {"PACKED": True, "HEAD_DIM": 64, "BLOCK_T": wa.ROPE_BLOCK_T},
                            wa.NUM_WARPS, 2).asm["cubin"]


def test_rope_kernel_compiles_for_the_h200():
    signature = {"qkv_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                 **{name: "i32" for name in ("T", "stride_n", "stride_t", "stride_rn", "stride_rt")}}
    constants = {"HEAD_DIM": 64, "HEADS": wa.ROPE_HEADS, "BLOCK_T": wa.ROPE_BLOCK_T}
    assert compile_for_h200(wa._rope_kernel, signature, constants, wa.NUM_WARPS, 2).asm["cubin"]


@pytest.mark.parametrize("width", [768, 1280])  # the codec's two LayerNorm widths
def test_layer_norm_kernel_compiles_for_the_h200_without_spills(width, tmp_path):
    import triton

    block_n = triton.next_power_of_2(width)
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16",
                 **{name: "i32" for name in ("M", "N", "stride_x", "stride_out")}, "eps": "fp32"}
    constants = {"HAS_WEIGHT": True, "HAS_BIAS": True, "BLOCK_M": max(1, ln.TILE_VALUES // block_n), "BLOCK_N": block_n}
    kernel = compile_for_h200(ln._layer_norm_kernel, signature, constants, ln.NUM_WARPS, 2,
                              ("x_ptr", "w_ptr", "b_ptr", "out_ptr", "N", "stride_x", "stride_out"))
    assert "0 bytes spill stores" in ptxas_report(kernel.asm["ptx"], tmp_path)


# ------------------------------------------------------------------ fused_linear
def ptxas_report(ptx: str, tmp_path) -> str:
    """What ptxas -v says of the kernel for sm_90a: registers, spills, and the C7515 warning when
    it has to serialize the wgmmas."""
    import subprocess

    from triton.backends.nvidia.compiler import get_ptxas

    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    proc = subprocess.run([get_ptxas(H200[0]).path, "-arch=sm_90a", "-v", str(source), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, check=True)
    return proc.stdout + proc.stderr


def compile_fused_linear(config: fl.GemmConfig, has_norm: bool, gelu: bool, dtype: str = "bf16", n_major: bool = True,
                         even_k: bool = True, residual: bool = False, tanh: bool = False):
    """As the codec launches it: strides and sizes multiples of 16, W's unit stride specialized."""
    tensor = f"*{dtype}"
    split = config.split_k > 1
    signature = {"x_ptr": tensor, "w_ptr": tensor, "y_ptr": tensor, "gamma_ptr": tensor, "beta_ptr": tensor,
                 "partials_ptr": "*fp32" if split else tensor, "arrivals_ptr": "*i32" if split else tensor,
                 **{name: "i32" for name in ("M", "N", "K", "stride_xm", "stride_wk", "stride_wn", "stride_ym")},
                 "eps": "fp32"}
    unit_stride = "stride_wn" if n_major else "stride_wk"
    del signature[unit_stride]
    constants = {unit_stride: 1, "HAS_NORM": has_norm, "HAS_GELU": gelu, "GELU_TANH": tanh, "HAS_RESIDUAL": residual,
                 "EVEN_K": even_k,
                 "SPLIT_K": config.split_k, "BLOCK_M": config.block_m,
                 "BLOCK_N": config.block_n, "BLOCK_K": config.block_k, "GROUP_M": config.group_m}
    divisible = [name for name in ("x_ptr", "w_ptr", "y_ptr", "gamma_ptr", "beta_ptr", "partials_ptr", "N", "K", "stride_xm",
                                   "stride_wk", "stride_wn", "stride_ym") if name in signature]
    return compile_for_h200(fl._fused_linear_kernel, signature, constants, config.num_warps, config.num_stages,
                            tuple(divisible))


# Every tile of the table in each use it serves (plain: the comparison GEMM; norm: in_proj without
# and ffn[0] with GELU), bf16 with the prepared (N-major) weight: ~5 s each on the 2-core machine.
FUSED_LINEAR_CASES = [(kind, rows, config, gelu) for kind, table in fl.CONFIG_TABLE.items() for rows, config in table
                      for gelu in ((False, True) if kind == "norm" else (False,))]


FUSED_LINEAR_IDS = [f"{kind}-{rows if rows < 2**62 else 'rest'}-{'gelu' if gelu else 'linear'}"
                    for kind, rows, _, gelu in FUSED_LINEAR_CASES]


@pytest.mark.parametrize("kind, rows, config, gelu", FUSED_LINEAR_CASES, ids=FUSED_LINEAR_IDS)
def test_fused_linear_tiles_compile_without_spills_or_serialized_wgmma(kind, rows, config, gelu, tmp_path):
    kernel = compile_fused_linear(config, kind == "norm", gelu)
    report = ptxas_report(kernel.asm["ptx"], tmp_path)
    assert "0 bytes spill stores" in report and "C7515" not in report, report
    if kind == "norm" and config.block_m >= 64:  # the normalized tile feeds wgmma from registers
        assert "ttng.warp_group_dot" in kernel.asm["ttgir"]


# The small-GEMM path (codec.transformer, small_gemm_rows): every few-token tile of the table in
# the uses a layer makes of it (ffn0 with either GELU), with W in nn.Linear's layout (K-contiguous),
# as it serves, and N-major (the weights the gelu / norm_gelu fusions repack).
SMALL_GEMM_CASES = [(rows, config, use, n_major) for kind, table in fl.CONFIG_TABLE.items() for rows, config in table
                    if rows <= 64 for use in (("in_proj", "ffn0", "ffn0_tanh") if kind == "norm" else ("residual",))
                    for n_major in (False, True)]


@pytest.mark.parametrize("rows, config, use, n_major", SMALL_GEMM_CASES,
                         ids=[f"{r}-{u}-{'n' if n else 'k'}" for r, _, u, n in SMALL_GEMM_CASES])
def test_small_gemm_tiles_compile_without_spills(rows, config, use, n_major, tmp_path):
    kernel = compile_fused_linear(config, use != "residual", use.startswith("ffn0"), n_major=n_major,
                                  residual=use == "residual", tanh=use == "ffn0_tanh")
    report = ptxas_report(kernel.asm["ptx"], tmp_path)
    assert "0 bytes spill stores" in report, report


@pytest.mark.parametrize("use", ["residual", "ffn0_tanh"])
def test_split_k_compiles_without_spills_with_its_release_acquire_atomic(use, tmp_path):
    """Split-K (GemmConfig.split_k): the partials' barrier, then one acq_rel atomic at gpu scope,
    and the last share's L1-bypassing loads, in the sm_90 PTX."""
    config = fl.GemmConfig(16, 32, 128, 4, 4, split_k=4)
    kernel = compile_fused_linear(config, use != "residual", use != "residual", n_major=False,
                                  residual=use == "residual", tanh=use == "ffn0_tanh")
    ptx = kernel.asm["ptx"]
    assert "0 bytes spill stores" in ptxas_report(ptx, tmp_path)
    assert "atom.global.gpu.acq_rel.add" in ptx and "bar.sync" in ptx and ".cg." in ptx, \
        [line for line in ptx.splitlines() if "atom" in line or "ld.global" in line][:10]


def test_fused_linear_compiles_for_float32_nn_linear_layout_and_ragged_k():
    """The paths the codec's bf16 serving never takes, each once."""
    assert compile_fused_linear(fl.gemm_config(10_000, True), True, True, dtype="fp32").asm["cubin"]
    assert compile_fused_linear(fl.gemm_config(10_000, False), False, False, n_major=False).asm["cubin"]
    assert compile_fused_linear(fl.gemm_config(10_000, True), True, True, even_k=False).asm["cubin"]


# ------------------------------------------------------------------ the engine step's kernels
STEP_STRIDES = ("stride_qkv", "stride_cos", "stride_sin", "stride_qs", "stride_qh", "stride_cs", "stride_ct", "stride_ch")


# A KV cache's element type and, for int8, its scales (kernels/kv_format.py): the kernels' pointer
# types and their SCALED constant. An exact cache passes itself as the (unread) scale pointers.
CACHE_KINDS = {"bf16": ("*bf16", "*bf16", False), "fp8": ("*fp8e4nv", "*fp8e4nv", False),
               "int8": ("*i8", "*fp32", True)}


def cache_arguments(cache: str) -> tuple[dict, dict]:
    """(signature, constants) of a kernel's cache arguments for a cache kind of CACHE_KINDS."""
    values, scales, scaled = CACHE_KINDS[cache]
    return ({"k_cache_ptr": values, "v_cache_ptr": values, "ks_ptr": scales, "vs_ptr": scales,
             "stride_ss": "i32", "stride_st": "i32"}, {"SCALED": scaled})


@pytest.mark.parametrize("cache", sorted(CACHE_KINDS))
def test_decode_qkv_kernel_compiles_for_the_h200_without_spills(cache, tmp_path):
    """As the backbone launches it: 32 q heads, 8 kv heads, head_dim 128, bf16, into each cache."""
    t = "*bf16"
    cache_signature, _ = cache_arguments(cache)  # the kernel knows an int8 cache by its type
    signature = {"qkv_ptr": t, "qw_ptr": t, "kw_ptr": t, "cos_ptr": t, "sin_ptr": t, "pos_ptr": "*i64", "q_ptr": t,
                 **cache_signature, "eps": "fp32", **{name: "i32" for name in STEP_STRIDES}}
    kernel = compile_for_h200(sq._decode_qkv_kernel, signature, {"HEADS": 32, "KV_HEADS": 8, "BLOCK_H": 32, "HALF": 64},
                              sq.NUM_WARPS, 3, ("qkv_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr", *STEP_STRIDES))
    assert "0 bytes spill stores" in ptxas_report(kernel.asm["ptx"], tmp_path)


@pytest.mark.parametrize("cache", ["bf16", "int8"])
def test_prefill_qkv_kernel_compiles_for_the_h200_without_spills(cache, tmp_path):
    """The decode kernel's body for a batched prefill's tokens, each into its prompt's slot."""
    t = "*bf16"
    cache_signature, _ = cache_arguments(cache)
    signature = {"qkv_ptr": t, "qw_ptr": t, "kw_ptr": t, "cos_ptr": t, "sin_ptr": t, "pos_ptr": "*i64",
                 "slots_ptr": "*i64", "q_ptr": t, **cache_signature, "eps": "fp32",
                 "tokens_per_slot": "i32", **{name: "i32" for name in STEP_STRIDES}}
    kernel = compile_for_h200(sq._prefill_qkv_kernel, signature, {"HEADS": 32, "KV_HEADS": 8, "BLOCK_H": 32, "HALF": 64},
                              sq.NUM_WARPS, 3, ("qkv_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr", *STEP_STRIDES))
    assert "0 bytes spill stores" in ptxas_report(kernel.asm["ptx"], tmp_path)


@pytest.mark.parametrize("pos", [None, 1])  # a runtime position, and 1 (Triton makes an int 1 a constant)
def test_local_attention_kernel_compiles_for_the_h200(pos):
    """As the local frame launches it: 32 heads of 80 dims (40 pairs in a 64-wide tile), bf16."""
    t = "*bf16"
    signature = {"qkv_ptr": t, "cos_ptr": t, "sin_ptr": t, "k_cache_ptr": t, "v_cache_ptr": t, "out_ptr": t,
                 "pos": "i32", "scale": "fp32", **{name: "i32" for name in ("stride_qkv", "stride_cb", "stride_ct",
                                                                              "stride_out")}}
    constants = {"HEADS": 32, "HEAD_DIM": 80, "BLOCK_H": sq.LOCAL_BLOCK_H, "HALF": 64}
    if pos is not None:
        del signature["pos"]
        constants["pos"] = pos
    assert compile_for_h200(sq._local_attention_kernel, signature, constants, sq.NUM_WARPS, 3).asm["cubin"]


@pytest.mark.parametrize("gated", [True, False])
def test_silu_kernel_compiles_for_the_h200_with_vector_loads(gated):
    kernel = compile_for_h200(gs._silu_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16", "stride_row": "i32"},
                              {"WIDTH": 9728, "GATED": gated, "BLOCK": gs.BLOCK}, gs.NUM_WARPS, 3,
                              ("x_ptr", "out_ptr", "stride_row"))
    assert "v4" in kernel.asm["ptx"]  # 16-byte loads: the point of a constant width


@pytest.mark.parametrize("vocab, has_seen", [(1024, True), (2, False)])  # a codebook; the stop head
def test_draw_kernel_compiles_for_the_h200(vocab, has_seen, tmp_path):
    """As the local frame launches it: the codebook's draw has the tl.topk path and the full sort
    (runtime branches that must unify), the stop head's 16-wide block only the sort."""
    from moss_tts.kernels import sample_kernel as sk

    signature = {"logits_ptr": "*bf16", "logits_stride": "i32", "seen_ptr": "*i1" if has_seen else "*bf16",
                 "seen_stride": "i32", "penalty_ptr": "*fp32", "temperature_ptr": "*fp32", "top_k_ptr": "*i64",
                 "top_p_ptr": "*fp32", "seed_ptr": "*i64", "position_ptr": "*i64", "out_ptr": "*i64", "vocab": "i32"}
    block = sk._block(vocab)
    kernel = compile_for_h200(sk._draw_kernel, signature, {"HAS_SEEN": has_seen, "BLOCK": block, "FAST_K": sk.FAST_K,
                                                           "LIBDEVICE": True}, sk._num_warps(block), 3)
    assert kernel.asm["cubin"]


@pytest.mark.parametrize(("block_t", "num_warps", "cache"), [(16, 4, "bf16"), (32, 8, "bf16"), (16, 4, "int8")])
def test_prefill_attention_kernel_compiles_for_the_h200_without_spills(block_t, num_warps, cache, tmp_path):
    """As the backbone's prefills launch it: 32 query heads over 8 KV heads of 128, bf16, the cache's
    strides multiples of 16: the default tiles, and 32-row blocks on 8 warps (on 4 their 128 x 128
    fp32 accumulator spills); the default tile over an int8 cache and its scales."""
    t, strides = "*bf16", [f"stride_{x}{y}" for x in "qkvo" for y in "nth"]
    cache_signature, scaled = cache_arguments(cache)
    values = cache_signature["k_cache_ptr"]
    signature = {"q_ptr": t, "k_ptr": values, "v_ptr": values, "ks_ptr": cache_signature["ks_ptr"],
                 "vs_ptr": cache_signature["vs_ptr"], "stride_ss": "i32", "stride_st": "i32", "slots_ptr": "*i64",
                 "starts_ptr": "*i64", "lengths_ptr": "*i64",
                 "out_ptr": t, **{name: "i32" for name in strides}, "T": "i32", "max_rows": "i32", "qk_scale": "fp32"}
    config = pa.PrefillConfig(block_t=block_t, num_warps=num_warps)
    constants = {"GROUPS": 4, "BLOCK_G": 4, "BLOCK_T": block_t, "BLOCK_N": config.block_n, "HEAD_DIM": 128, **scaled}
    kernel = compile_for_h200(pa._prefill_kernel, signature, constants, config.num_warps, config.num_stages,
                              ("q_ptr", "k_ptr", "v_ptr", "out_ptr", *strides))
    assert "0 bytes spill stores" in ptxas_report(kernel.asm["ptx"], tmp_path)


@pytest.mark.parametrize("cache", sorted(CACHE_KINDS))
def test_decode_attention_kernel_compiles_for_the_h200_without_spills(cache, tmp_path):
    """As a decode step launches it at 256 slots: 32 query heads over 8 KV heads of 128, bf16 q,
    split partials, each cache with the tile decode_attention picks for it."""
    from moss_tts.kernels import decode_attention as da

    cache_signature, scaled = cache_arguments(cache)
    config = {"bf16": da.DEFAULT_CONFIG, "fp8": da.FP8_CONFIG, "int8": da.INT8_CONFIG}[cache]
    values = cache_signature["k_cache_ptr"]
    kinds = {"q_ptr": "*bf16", "k_ptr": values, "v_ptr": values, "ks_ptr": cache_signature["ks_ptr"],
             "vs_ptr": cache_signature["vs_ptr"], "lengths_ptr": "*i64", "out_ptr": "*bf16", "acc_ptr": "*fp32",
             "max_ptr": "*fp32", "sum_ptr": "*fp32", "qk_scale": "fp32"}
    # the unit strides (the head dim's) are 1 at every launch, which Triton makes constants
    units = {name: 1 for name in ("stride_qd", "stride_kd", "stride_vd", "stride_od")}
    constants = {"GROUPS": 4, "BLOCK_G": 16, "BLOCK_N": config.block_n, "HEAD_DIM": 128, "DIRECT": False,
                 "HEADS_FIRST": config.heads_first, "FP16_DOTS": config.fp16_dots and cache != "bf16",
                 **scaled, **units}
    signature = {name: kinds.get(name, "i32") for name in da._split_kernel.arg_names if name not in constants}
    kernel = compile_for_h200(da._split_kernel, signature, constants, config.num_warps, config.num_stages,
                              ("q_ptr", "k_ptr", "v_ptr", "stride_kt", "stride_vt"))
    assert "0 bytes spill stores" in ptxas_report(kernel.asm["ptx"], tmp_path)


def test_block_copy_kernel_compiles_for_the_h200_with_vector_loads():
    """As the engine's prefix copies launch it: bf16 blocks of 16 rows x 8 heads x 128 (16,384
    elements, 2,048 a step), the layer and block strides multiples of 16."""
    t, strides = "*bf16", ("src_layer", "src_block", "dst_layer", "dst_block")
    signature = {"src_k": t, "src_v": t, "dst_k": t, "dst_v": t, "src_index": "*i64", "dst_index": "*i64",
                 "size": "i32", **{name: "i32" for name in strides}}
    kernel = compile_for_h200(bc._copy_blocks_kernel, signature, {"BLOCK": bc.BLOCK}, bc.NUM_WARPS, 3,
                              ("src_k", "src_v", "dst_k", "dst_v", "size", *strides))
    assert "v4" in kernel.asm["ptx"]  # 16-byte loads and stores
