"""One local-transformer frame for a batch of rows: the stop decision, then 12 codebooks, each
fed back into the next, sampled on the device with no host sync.

The math of MossTTSLocalModel.sample_frame (and the same modules), arranged for a graphed step:
the RoPE tables of the 13 local positions are computed once at setup and each channel's
sampling runs as two fused kernels around its sort (the noise hash inside the draw), so a frame
launches about 300 kernels instead of about 850.
"""

from __future__ import annotations

import torch

from ..kernels import sample_kernel, step_qkv
from ..kernels.fused import Fusions
from ..model.local_transformer import LocalKVCache, LocalTransformer, interleaved_rope
from ..model.sampler import ChannelTensors, FrameSampling
from ..model.tts_model import STOP_INDEX, MossTTSLocalModel


class LocalRope:
    """cos/sin [1, 1, 1, head_dim] of each local position, broadcast over the batch."""

    def __init__(self, local: LocalTransformer, num_positions: int, device, dtype) -> None:
        positions = torch.arange(num_positions, device=device).unsqueeze(1)
        cos, sin = interleaved_rope(positions, local.cfg.head_dim, local.cfg.rope_base, dtype)
        # Own storage per position: a fused function recompiles for every new storage offset.
        self.cos = [cos[p:p + 1].clone() for p in range(num_positions)]
        self.sin = [sin[p:p + 1].clone() for p in range(num_positions)]


def local_step(local: LocalTransformer, f: Fusions, x: torch.Tensor, caches: list[LocalKVCache], pos: int,
               rope: LocalRope, attention_kernel: bool = False) -> torch.Tensor:
    """LocalTransformer.step (LocalBlock and LocalAttention, op for op) with the precomputed RoPE
    of `pos` and each residual add fused with the norm after it: x [B, H] -> hidden [B, H].
    attention_kernel: RoPE, the cache write and attention as one Triton kernel
    (step_qkv.local_attention_step) instead of four fused kernels and two copies."""
    h = x.unsqueeze(1)
    b, width = x.shape
    first = local.h[0].ln_1
    normed = f.layer_norm(h, first.weight, first.bias, first.eps)
    for i, (block, cache) in enumerate(zip(local.h, caches)):
        attn = block.attn
        if attention_kernel:
            out = step_qkv.local_attention_step(attn.c_attn(normed), rope.cos[pos], rope.sin[pos], cache.k, cache.v,
                                                pos, attn.cfg.num_heads)
        else:
            q, k, v = f.local_qkv_rope(attn.c_attn(normed), rope.cos[pos], rope.sin[pos], attn.cfg.num_heads)
            cache.k[:, pos:pos + 1] = k
            cache.v[:, pos:pos + 1] = v
            out = f.local_attention(q, cache.k[:, :pos + 1], cache.v[:, :pos + 1])
        out = attn.c_proj(out.reshape(b, 1, width))
        h, normed = f.add_layer_norm(h, out, block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
        delta = block.mlp.fc_out(f.silu(block.mlp.fc_in(normed)))
        after = local.h[i + 1].ln_1 if i + 1 < len(local.h) else local.ln_f
        h, normed = f.add_layer_norm(h, delta, after.weight, after.bias, after.eps)
    return normed.squeeze(1)


def _draw(select, scores, scaled, is_greedy, params: ChannelTensors, seed, position) -> torch.Tensor:
    sorted_scores, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    return select(sorted_scores, sorted_ids, scores, is_greedy, params.top_k, params.top_p, seed, position)


def sample_frame(model: MossTTSLocalModel, f: Fusions, rope: LocalRope, hidden: torch.Tensor,
                 state: FrameSampling, frame_index: torch.Tensor, use_kernel: bool = False,
                 attention_kernel: bool = False):
    """Backbone hidden [B, H] -> (is_stop [B] bool, codes [B, n_vq]) for frame `frame_index` [B].

    use_kernel: each draw (penalty, temperature, top-k/top-p over a register sort, Gumbel-max)
    is one Triton kernel (the runner decides once whether it can run here), instead of two
    fused kernels around a torch.sort. attention_kernel: local_step's one-kernel attention.
    """
    cfg, dtype = model.cfg, model.dtype
    local = model.local_transformer
    caches = local.new_caches(hidden.shape[0], cfg.n_vq + 1, hidden.device, dtype)
    base = frame_index * (cfg.n_vq + 1)
    u = local_step(local, f, hidden.to(dtype), caches, 0, rope, attention_kernel)
    stop_logits = model.stop_logits(u)
    if use_kernel:
        p = state.stop
        is_stop = sample_kernel.draw_tokens(stop_logits, None, p.repetition_penalty, p.temperature, p.top_k,
                                            p.top_p, state.seed, base).eq(STOP_INDEX)
    else:
        scores, scaled, is_greedy = f.temperature_scores(stop_logits, state.stop.temperature)
        is_stop = _draw(f.select_stop, scores, scaled, is_greedy, state.stop, state.seed, base).eq(STOP_INDEX)
    codes: list[torch.Tensor] = []
    for c in range(cfg.n_vq):
        if c > 0:
            u = local_step(local, f, model.audio_embeddings[c - 1](codes[-1]).to(dtype), caches, c, rope,
                           attention_kernel)
        logits, a = model.code_logits(u, c), state.audio
        if use_kernel:
            codes.append(sample_kernel.draw_tokens(logits, state.seen[:, c], a.repetition_penalty, a.temperature,
                                                   a.top_k, a.top_p, state.seed, base + c + 1))
            continue
        # contiguous(): a compiled function recompiles for every distinct input storage offset.
        scores, scaled, is_greedy = f.penalized_scores(logits, state.seen[:, c].contiguous(),
                                                       a.repetition_penalty, a.temperature)
        codes.append(_draw(f.select_token, scores, scaled, is_greedy, a, state.seed, base + c + 1))
    return is_stop, torch.stack(codes, dim=-1)
