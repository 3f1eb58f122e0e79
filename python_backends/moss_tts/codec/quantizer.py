"""Residual LFQ quantizer of the codec (inference only, always fp32).

Encode: z = input_proj(x); for each used quantizer the residual is projected to the 8-dim
code space, L2-normalised together with the codebook, matched to the nearest entry, and the
*un-normalised* entry is projected back and subtracted. Decode sums the projected entries and
applies output_proj. Projections are weight-normed 1x1 Conv1d, which gives the on-disk names
`.parametrizations.weight.original0/1` and `.bias`.

Decode is linear in each codebook's entry, so the serving form (`freeze_decode_table_`) computes
every codebook's entries through out_proj and output_proj once, in float64, into one fp32 table
(output_proj's bias in codebook 0's rows, each out_proj bias in its codebook's rows): a decode is
then one gather and one sum, 3 kernels a codec step instead of ~50 (per codebook an embedding, a
cast, a projection and an add; issue 34: ~0.1 ms of a 3.7 ms 1 x 2 step). Same function; fp32
rounding order differs, as it does for the folded weight norm. The table holds every codebook:
num_quantizers x codebook_size x output_dim fp32 (real codec: 32 x 1024 x 768, 96 MiB).
Codes must lie in 0..codebook_size-1 (callers check them on the host: vocoder/step_buffers.check_codes),
since a code past its codebook would read the next codebook's rows instead of failing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from .config import QuantizerConfig


def _wn_conv(cin: int, cout: int) -> nn.Module:
    """Weight-normed 1x1 conv; upstream uses no projection at all (no tensors on disk) when
    the dimensions already match, so neither do we."""
    if cin == cout:
        return nn.Identity()
    return weight_norm(nn.Conv1d(cin, cout, kernel_size=1))


def _pointwise(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A 1x1 conv (or identity) applied to channel-last x [B, T, Cin]."""
    if isinstance(conv, nn.Identity):
        return x
    return F.linear(x, conv.weight.squeeze(-1), conv.bias)


class LFQ(nn.Module):
    def __init__(self, dim: int, codebook_size: int, codebook_dim: int):
        super().__init__()
        self.in_proj = _wn_conv(dim, codebook_dim)
        self.out_proj = _wn_conv(codebook_dim, dim)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)

    def nearest(self, latents: torch.Tensor) -> torch.Tensor:
        """Code index per row of latents [N, codebook_dim], by cosine distance."""
        enc = F.normalize(latents.float())
        book = F.normalize(self.codebook.weight.float())
        # Same expanded squared-distance expression as upstream, for identical tie-breaking.
        dist = enc.pow(2).sum(1, keepdim=True) - 2 * enc @ book.t() + book.pow(2).sum(1, keepdim=True).t()
        return (-dist).max(1)[1]

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T] -> [B, T, dim]."""
        return _pointwise(self.out_proj, F.embedding(codes, self.codebook.weight).float())


def _pointwise64(conv: nn.Module, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
    """_pointwise in float64 (x float64), its bias left out when `bias` is False."""
    if isinstance(conv, nn.Identity):
        return x
    return F.linear(x, conv.weight.squeeze(-1).double(), conv.bias.double() if bias else None)


class ResidualLFQ(nn.Module):
    def __init__(self, q: QuantizerConfig):
        super().__init__()
        self.config = q
        self.input_proj = _wn_conv(q.input_dim, q.rvq_dim)
        self.output_proj = _wn_conv(q.rvq_dim, q.output_dim)
        self.quantizers = nn.ModuleList(
            LFQ(q.rvq_dim, q.codebook_size, q.codebook_dim) for _ in range(q.num_quantizers))
        # freeze_decode_table_ (serving form): [num_quantizers * codebook_size, output_dim] fp32,
        # and each codebook's first row in it
        self.register_buffer("decode_table", None, persistent=False)
        self.register_buffer("decode_offsets", None, persistent=False)

    @torch.no_grad()
    def freeze_decode_table_(self) -> None:
        """Serving form: decode by one gather-and-sum over a table of every codebook entry already
        projected to the output (module docstring). Idempotent; not in state_dict, so weights
        loaded after it are not in the table: call it last, as serving_form_ does, on the module
        in its final device and fp32 (a .half() would make the table and decode fp16)."""
        if self.decode_table is not None:
            return
        rows = []
        for i, quantizer in enumerate(self.quantizers):  # one codebook's float64 at a time
            entries = _pointwise64(quantizer.out_proj, quantizer.codebook.weight.double())
            # output_proj is affine: its bias once, in codebook 0's rows (every decode reads one)
            rows.append(_pointwise64(self.output_proj, entries, bias=i == 0).float())
        self.decode_table = torch.cat(rows)
        self.decode_offsets = torch.arange(len(rows), device=self.decode_table.device) * self.config.codebook_size

    @torch.no_grad()
    def freeze_weight_norm_(self) -> None:
        """Replace every weight-norm parametrization by the weight it computes (serving)."""
        for module in self.modules():
            if parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)

    def check_n_quantizers(self, n: int) -> None:
        if not 1 <= n <= self.config.num_quantizers:
            raise ValueError(f"n_quantizers must be in 1..{self.config.num_quantizers}, got {n}")

    @torch.no_grad()
    def encode(self, x: torch.Tensor, lengths: torch.Tensor, n_quantizers: int) -> torch.Tensor:
        """x [B, T, input_dim] -> codes [B, T, n_quantizers]. Frames t >= lengths[b] are
        quantized from a zeroed residual and leave it unchanged, as upstream does for padding."""
        self.check_n_quantizers(n_quantizers)
        b, t, _ = x.shape
        residual = _pointwise(self.input_proj, x.float())
        valid = (torch.arange(t, device=x.device) < lengths.to(x.device)[:, None])[..., None]
        codes = []
        for quantizer in self.quantizers[:n_quantizers]:
            latents = _pointwise(quantizer.in_proj, residual * valid)
            idx = quantizer.nearest(latents.reshape(b * t, -1)).view(b, t)
            entry = F.embedding(idx, quantizer.codebook.weight).float()
            # Upstream's straight-through form latents + (entry - latents); kept for equal rounding.
            projected = _pointwise(quantizer.out_proj, latents + (entry - latents))
            residual = residual - projected * valid
            codes.append(idx)
        return torch.stack(codes, dim=-1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, n_q] (1 <= n_q <= num_quantizers) -> [B, T, output_dim] fp32."""
        self.check_n_quantizers(codes.shape[-1])
        if self.decode_table is not None:
            return F.embedding(codes + self.decode_offsets[: codes.shape[-1]], self.decode_table).sum(-2)
        total = sum(q.embed(codes[..., i]) for i, q in enumerate(self.quantizers[: codes.shape[-1]]))
        return _pointwise(self.output_proj, total)
