"""Causal sliding-window transformer used by every codec stage (ProjectedTransformer).

Numerics follow the upstream codec: pre-LN layers (LayerNorm eps 1e-5), fused bias-free
qkv projection, RoPE on adjacent (even, odd) pairs computed in fp32, attention with the default
1/sqrt(head_dim) scale, LayerScale on both residual branches and an exact (erf) GELU FFN.
Module attribute names equal the on-disk tensor names, so state_dict() is the checkpoint layout.

What runs between the attention projections is kernels/window_attention.py, in two modes that
share the weights:
- offline (no rings): the whole sequence, each query seeing the last `context` keys;
- streaming (one `Ring` per layer): the decoded rows' ring buffers in the decode state are read
  and written in place, at their slots.
LayerScale + residual is one addcmul (fp32 math, one rounding) rather than a multiply and an add;
in the serving form (`fold_layer_scale_`) LayerScale lives in the weights that end each residual
branch and the add happens inside that GEMM (addmm_ into the residual stream), so no elementwise
pass remains for it. Both forms round differently from upstream, never compute differently.
On a GPU the serving form may run the norms and the GELU otherwise (`fuse_`, FUSIONS):
- "ln": both LayerNorms as kernels/layer_norm.py's one-pass kernel (the same math as torch's,
  up to fp32 rounding order);
- "lt_gelu": ffn[0] and its GELU as one cuBLASLt GEMM with a GELU epilogue
  (torch._addmm_activation): one full pass over the FFN's hidden activations fewer per layer.
  That GELU is the tanh approximation, not upstream's erf; its effect on the audio against the
  fp32 reference is measured by perf/bench_vocoder.py --fidelity (perf/RESULTS.md);
- "ln_lt_gelu": both;
- "gelu", "norm_gelu": kernels/fused_linear.py's Triton GEMM with the GELU in its epilogue and
  (norm_gelu) each LayerNorm in the GEMM after it. Exact GELU, but on the H200 that GEMM is
  still slower than cuBLAS plus torch's passes (perf/RESULTS.md, issue 34).
A step of at most `small_gemm_rows` tokens (TransformerLayer.small_gemm_; 0 = never) runs each
layer's four GEMMs as kernels/fused_linear.py's, whatever the fusion: norm1+in_proj,
out_proj+residual, norm2+ffn[0]+GELU, ffn[2]+residual. The GELU is the fusion's (tanh under the
cuBLASLt fusions, else exact), so a layer computes one function on both paths and a stream's
audio does not depend on the size of the step it shared. At a few tokens every GEMM is bound by
latency, and this is 7 graph nodes a layer with the attention's 3 instead of ~10 (no LayerNorm
kernels, no split-K reduces). The choice is by shape, so each captured graph has one form.
Served off: fewer nodes did not make the step faster, since the fused kernels read the weights
slower than cuBLAS (1 x 2 step 5.46 ms at 64 rows against 3.90 on the H200; perf/RESULTS.md,
issue 34 round 21).
A streaming layer's RoPE, attention and ring write run as `ring_kernel` says (RING_KERNELS,
Attention.use_ring_kernel_): "split", window_attention's three kernels, or "fused", one kernel
(kernels/fused_window_attention.py): ~184 graph nodes fewer per codec step. Same results, bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels import fused_linear, layer_norm
from ..kernels.fused_window_attention import RING_KERNELS, fused_window_attention
from ..kernels.window_attention import Ring, Rope, can_run_triton, rope_frequencies, rope_table, window_attention
from .config import TransformerStage
from .streaming import Packing


# How TransformerLayer.fuse_ may run the norms and the GELU on a GPU (module docstring).
FUSIONS = ("none", "ln", "lt_gelu", "ln_lt_gelu", "gelu", "norm_gelu")
TRITON_GEMM_FUSIONS = ("gelu", "norm_gelu")  # kernels/fused_linear.py
NORM_KERNEL_FUSIONS = ("ln", "ln_lt_gelu")  # kernels/layer_norm.py
LT_GELU_FUSIONS = ("lt_gelu", "ln_lt_gelu")  # cuBLASLt's GELU epilogue
# What the vocoder serves unless told otherwise (moss_tts's vocoder_fusion, the vocoder model's
# fusion): on the H200 the fastest (perf/RESULTS.md, issue 34).
DEFAULT_FUSION = "ln_lt_gelu"
# How streaming attention layers run unless told otherwise (moss_tts's vocoder_ring_kernel, the
# vocoder model's ring_kernel): the split kernels. "fused" gave the same results bit for bit on
# the H200 and measured no faster there (perf/RESULTS.md, issue 34 round 18).
DEFAULT_RING_KERNEL = "split"
# How the decode state's rings store keys and values (MossAudioCodec.serving_form_'s ring_dtype,
# the vocoder's ring_dtype, moss_tts's vocoder_ring_dtype; kernels/kv_format.py's rules): "auto" =
# the codec's dtype (exact); "fp8_e4m3" = one byte each, clamped and rounded once, widened on every
# read: half the bytes the streaming attention reads. An approximation, opt-in, and measured slower:
# on an H100 a packed 128-row round took 27.9-28.1 ms against 25.5-25.9 with exact rings (the
# attention kernel 6.35 ms against 4.41: its two loads a tile and the widening cost more than the
# bytes save), and the streamed audio moved by 37.4 dB SNR (perf/RESULTS.md, issue 34 round 26).
# Needs a GPU of compute capability 8.9 or newer where it runs on one.
RING_DTYPES = ("auto", "fp8_e4m3")
DEFAULT_RING_DTYPE = "auto"
# The most tokens a step may have at a stage for small_gemm_ to run it: the kernel's 16- and
# 64-row tiles. Its 128-row tiles read nn.Linear's K-contiguous weights with serialized wgmmas in
# in_proj (ptxas C7515), so larger steps stay with cuBLAS.
SMALL_GEMM_MAX_ROWS = 64


def check_small_gemm_rows(rows: int, parameter: str = "small_gemm_rows") -> int:
    """`rows` if it is a small_gemm_ setting (0 = off), else ValueError naming `parameter`."""
    if not 0 <= rows <= SMALL_GEMM_MAX_ROWS:
        raise ValueError(f"{parameter} must lie in [0, {SMALL_GEMM_MAX_ROWS}] (0 = off), got {rows}")
    return rows


class Attention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, context: int):
        super().__init__()
        self.num_heads, self.context = num_heads, context  # RoPE: the stage's table (ProjectedTransformer)
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.ring_kernel = DEFAULT_RING_KERNEL  # use_ring_kernel_: how a streaming step runs (RING_KERNELS)

    def use_ring_kernel_(self, ring_kernel: str) -> str:
        """Serving form: run streaming steps with `ring_kernel` (RING_KERNELS; offline steps run
        what they ran). Where the Triton kernels cannot run (CPU) nothing changes: the torch
        reference runs either way. Set before the codec's graphs are captured: they keep the
        kernels they captured. Returns the ring kernel that runs."""
        if ring_kernel not in RING_KERNELS:
            raise ValueError(f"ring_kernel must be one of {RING_KERNELS}, got {ring_kernel!r}")
        if can_run_triton(self.in_proj.weight):
            self.ring_kernel = ring_kernel
        return self.ring_kernel

    def attend(self, x: torch.Tensor, rope: Rope, ring: Ring | None = None) -> torch.Tensor:
        """Everything before out_proj: [B, T, d] -> [B, T, d]."""
        return self.attend_qkv(self.in_proj(x), rope, ring)

    def attend_qkv(self, qkv: torch.Tensor, rope: Rope, ring: Ring | None = None) -> torch.Tensor:
        """attend() from in_proj's output qkv [B, T, 3d] (computed by the caller)."""
        if self.ring_kernel == "fused":  # offline (ring None) it runs window_attention
            return fused_window_attention(qkv, rope, self.num_heads, self.context, ring)
        return window_attention(qkv, rope, self.num_heads, self.context, ring)

    def forward(self, x: torch.Tensor, rope: Rope, ring: Ring | None = None) -> torch.Tensor:
        return self.out_proj(self.attend(x, rope, ring))


class LayerScale(nn.Module):
    def __init__(self, channels: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((channels,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, s: TransformerStage):
        super().__init__()
        self.self_attn = Attention(s.d_model, s.num_heads, s.context)
        self.norm1 = nn.LayerNorm(s.d_model, eps=1e-5)
        self.norm2 = nn.LayerNorm(s.d_model, eps=1e-5)
        self.ffn = nn.Sequential(nn.Linear(s.d_model, s.dim_feedforward, bias=False), nn.GELU(),
                                 nn.Linear(s.dim_feedforward, s.d_model, bias=False))
        self.layer_scale_1 = LayerScale(s.d_model, s.layer_scale)
        self.layer_scale_2 = LayerScale(s.d_model, s.layer_scale)
        self.scale_folded = False
        self.fusion = "none"  # fuse_: how the norms and the GELU run (FUSIONS)
        self.small_gemm_rows = 0  # small_gemm_: steps of at most this many tokens run four fused GEMMs

    @torch.no_grad()
    def fold_layer_scale_(self) -> None:
        """Serving form: scale the rows of out_proj and ffn.2 by their LayerScale (in fp32, then
        rounded once) so the residual add can run in the GEMM. The LayerScale parameters stay as
        loaded (state_dict names), unused. Idempotent."""
        if self.scale_folded:
            return
        for scale, linear in ((self.layer_scale_1, self.self_attn.out_proj), (self.layer_scale_2, self.ffn[2])):
            weight = linear.weight
            weight.copy_((weight.float() * scale.scale.float()[:, None]).to(weight.dtype))
        self.scale_folded = True

    @torch.no_grad()
    def fuse_(self, fusion: str) -> str:
        """Serving form on a GPU: how the norms and the GELU run (FUSIONS, module docstring).
        For the Triton GEMM fusions the weights those GEMMs read are stored once in the layout
        the kernel reads fastest (same values; nn.Linear and addmm read it too). Where the
        chosen kernels cannot run (CPU, no Triton) nothing changes. Returns the fusion that
        runs; once chosen it stays (a second call returns it)."""
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}, got {fusion!r}")
        if self.fusion != "none" or fusion == "none":
            return self.fusion
        up = self.ffn[0].weight
        probe = up.new_empty(1, up.shape[1])
        if fusion in TRITON_GEMM_FUSIONS:
            weights = [up] + ([self.self_attn.in_proj.weight] if fusion == "norm_gelu" else [])
            if not all(fused_linear.is_supported(probe, w) for w in weights):
                return self.fusion
            for w in weights:
                w.data = fused_linear.prepare_weight(w.data)
        elif not up.is_cuda or (fusion in NORM_KERNEL_FUSIONS and not all(
                layer_norm.is_supported(probe, n.weight, n.bias) for n in (self.norm1, self.norm2))):
            return self.fusion  # cuBLASLt and the norm kernel: CUDA only
        if fusion in LT_GELU_FUSIONS:
            # cuBLASLt's bias-and-GELU epilogue needs a bias: zeros, not in state_dict.
            self.register_buffer("gelu_bias", up.new_zeros(up.shape[0]), persistent=False)
        self.fusion = fusion
        return fusion

    @torch.no_grad()
    def small_gemm_(self, rows: int) -> int:
        """Serving form on a GPU: steps of at most `rows` tokens (x's rows, a graph's static shape)
        run the layer's GEMMs as four fused_linear kernels (module docstring); 0 = never. Needs the
        folded LayerScale (the residual adds run in the GEMMs) and the Triton kernel (CUDA, or the
        interpreter); otherwise nothing changes. Returns the rows that run."""
        check_small_gemm_rows(rows)
        weights = (self.self_attn.in_proj.weight, self.self_attn.out_proj.weight, self.ffn[0].weight, self.ffn[2].weight)
        if self.scale_folded and all(fused_linear.is_supported(w.new_empty(1, w.shape[1]), w) for w in weights):
            self.small_gemm_rows = rows
        return self.small_gemm_rows

    def forward(self, x: torch.Tensor, rope: Rope, ring: Ring | None = None) -> torch.Tensor:
        if self.small_gemm_rows and x.numel() <= self.small_gemm_rows * x.shape[-1]:
            return self._small_gemm_forward(x, rope, ring)
        attn, ffn, n1, n2, fusion = self.self_attn, self.ffn, self.norm1, self.norm2, self.fusion
        if fusion == "norm_gelu":
            qkv = fused_linear.fused_linear(x, attn.in_proj.weight, n1.weight, n1.bias, n1.eps)
        else:
            qkv = attn.in_proj(self._norm(n1, x))
        x = self._residual(x, attn.attend_qkv(qkv, rope, ring), attn.out_proj, self.layer_scale_1)
        if fusion == "norm_gelu":
            hidden = fused_linear.fused_linear(x, ffn[0].weight, n2.weight, n2.bias, n2.eps, gelu=True)
        elif fusion == "gelu":
            hidden = fused_linear.fused_linear(n2(x), ffn[0].weight, gelu=True)
        elif fusion in LT_GELU_FUSIONS:
            normed = self._norm(n2, x)
            hidden = torch._addmm_activation(self.gelu_bias, normed.reshape(-1, normed.shape[-1]), ffn[0].weight.t(),
                                             use_gelu=True).view(*normed.shape[:-1], -1)
        else:
            hidden = ffn[1](ffn[0](self._norm(n2, x)))
        return self._residual(x, hidden, ffn[2], self.layer_scale_2)

    def _small_gemm_forward(self, x: torch.Tensor, rope: Rope, ring: Ring | None) -> torch.Tensor:
        """forward in four fused_linear GEMMs, the residual adds in place into x (as addmm_ does).
        The GELU is the one the layer's fusion computes on larger steps (tanh under cuBLASLt's
        epilogue, else exact), so a stream's audio does not depend on which path its step took."""
        attn, ffn, n1, n2 = self.self_attn, self.ffn, self.norm1, self.norm2
        approximate = "tanh" if self.fusion in LT_GELU_FUSIONS else "none"
        qkv = fused_linear.fused_linear(x, attn.in_proj.weight, n1.weight, n1.bias, n1.eps)
        fused_linear.fused_linear(attn.attend_qkv(qkv, rope, ring), attn.out_proj.weight, residual=x)
        hidden = fused_linear.fused_linear(x, ffn[0].weight, n2.weight, n2.bias, n2.eps, gelu=True,
                                           approximate=approximate)
        return fused_linear.fused_linear(hidden, ffn[2].weight, residual=x)

    def _norm(self, norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        if self.fusion in NORM_KERNEL_FUSIONS:
            return layer_norm.layer_norm(x, norm.weight, norm.bias, norm.eps)
        return norm(x)

    def _residual(self, x: torch.Tensor, branch: torch.Tensor, linear: nn.Linear, scale: LayerScale) -> torch.Tensor:
        if self.scale_folded:
            # x += branch @ W^T with beta = 1: the GEMM reads the residual and writes it back, one
            # rounding, and no pass of its own. x is this layer's private residual stream.
            x.view(-1, x.shape[-1]).addmm_(branch.reshape(-1, branch.shape[-1]), linear.weight.t())
            return x
        return torch.addcmul(x, scale.scale, linear(branch))


class Transformer(nn.Module):
    def __init__(self, s: TransformerStage):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(s) for _ in range(s.num_layers))

    def forward(self, x: torch.Tensor, rope: Rope, rings: list[Ring] | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, None if rings is None else rings[i])
        return x


class ProjectedTransformer(nn.Module):
    """Linear in -> transformer -> linear out, channel-last [B, T, C]. v2 keeps both
    projections even when dimensions match (the checkpoint stores them), unlike v1."""

    def __init__(self, s: TransformerStage):
        super().__init__()
        self.stage = s
        self.input_proj = nn.Linear(s.input_dimension, s.d_model, bias=False)
        self.transformer = Transformer(s)
        self.output_proj = nn.Linear(s.d_model, s.output_dimension, bias=False)
        # RoPE frequencies per device, made on first use: a step's first (uncaptured) run makes
        # them, so captured graphs only read them. Not a buffer: the codec is built on meta.
        self._freqs: dict[torch.device, torch.Tensor] = {}

    def _rope(self, positions: torch.Tensor) -> Rope:
        s = self.stage
        freqs = self._freqs.get(positions.device)
        if freqs is None:
            freqs = self._freqs[positions.device] = rope_frequencies(s.head_dim, s.max_period, positions.device)
        return rope_table(positions, s.head_dim, s.max_period, freqs)

    def forward(self, x: torch.Tensor, caches: list[torch.Tensor] | None = None, rows: torch.Tensor | None = None,
                offsets: torch.Tensor | None = None, packing: Packing | None = None) -> torch.Tensor:
        """x [B, T, in]. Offline without caches; streaming with the decode state's caches of this
        stage's layers ([2, S, H, W, Dh] each), the state rows [B] that x's rows continue and their
        stream positions `offsets` [B] at this stage. Packed (`packing`): x [1, N*scale, in] holds
        the rows' tokens back to back (rows and offsets [n]); each codec frame is `scale`
        consecutive tokens at this stage. One RoPE table serves every layer."""
        steps = torch.arange(x.shape[1], device=x.device)
        if caches is None:
            rope, rings = self._rope(steps[None]), None
        elif packing is not None:
            scale = x.shape[1] // packing.num_frames
            # Frame f of a row covers its positions f*scale .. f*scale + scale - 1 at this stage.
            within = torch.arange(scale, device=x.device)
            positions = (packing.positions[:, None] * scale + within).reshape(1, -1)
            rope = self._rope(positions)
            starts, lengths = packing.starts * scale, packing.lengths * scale
            rings = [Ring(cache[0], cache[1], rows, offsets, starts, lengths, packing.max_frames * scale)
                     for cache in caches]
        else:
            rope = self._rope(offsets[:, None] + steps)
            rings = [Ring(cache[0], cache[1], rows, offsets) for cache in caches]
        return self.output_proj(self.transformer(self.input_proj(x), rope, rings))
