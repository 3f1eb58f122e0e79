"""MossAudioCodec: MOSS-Audio-Tokenizer-v2 (48 kHz stereo, 12.5 frames/s, up to 32 codebooks).

Stereo audio [B, 2, S] is padded to whole frames, interleaved into one stream (L0 R0 L1 R1 ...)
and reduced by the encoder stages (patches multiply to 2 x 3840 = 7680 stream samples per
frame). The decoder mirrors this and its single output stream is de-interleaved to [B, 2, S].
Layout is channel-last [B, T, C] throughout; the encoder runs in the parameter dtype, the
quantizer always in fp32 (as upstream, which keeps it out of autocast).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from .config import CodecConfig, PatchStage, TransformerStage
from .patch import Patch, deinterleave, interleave
from .quantizer import ResidualLFQ
from .streaming import CodecDecodeState, Packing
from ..kernels.kv_format import FP8_MIN_CAPABILITY, cache_dtype, lacks_fp8
from .transformer import (DEFAULT_RING_DTYPE, DEFAULT_RING_KERNEL, RING_DTYPES, RING_KERNELS, ProjectedTransformer,
                          TransformerLayer, check_small_gemm_rows)

log = logging.getLogger(__name__)


def _stack(stages, downsample: bool) -> nn.ModuleList:
    # Index in the ModuleList == index in config.json == index in the tensor names.
    return nn.ModuleList(Patch(s.patch_size, downsample) if isinstance(s, PatchStage) else ProjectedTransformer(s)
                         for s in stages)


class MossAudioCodec(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        self.encoder = _stack(config.encoder, downsample=True)
        self.quantizer = ResidualLFQ(config.quantizer)
        self.decoder = _stack(config.decoder, downsample=False)
        # Stream positions per codec frame at the input of each decoder stage (RoPE offsets).
        scales, scale = [], 1
        for stage in config.decoder:
            scales.append(scale)
            scale *= stage.patch_size if isinstance(stage, PatchStage) else 1
        self._decoder_scales = scales
        self.ring_dtype = DEFAULT_RING_DTYPE  # serving_form_: how new decode states' rings store keys

    # ---------------------------------------------------------------- properties
    @property
    def sample_rate(self) -> int:
        return self.config.sampling_rate

    @property
    def channels(self) -> int:
        return self.config.number_channels

    @property
    def samples_per_frame(self) -> int:
        return self.config.downsample_rate

    @property
    def frame_rate(self) -> float:
        return self.config.frame_rate

    @property
    def num_quantizers(self) -> int:
        return self.config.quantizer.num_quantizers

    @property
    def codebook_size(self) -> int:
        return self.config.quantizer.codebook_size

    def serving_form_(self, fusion: str = "none", ring_kernel: str = DEFAULT_RING_KERNEL,
                      small_gemm_rows: int = 0, ring_dtype: str = DEFAULT_RING_DTYPE) -> "MossAudioCodec":
        """The form the vocoder serves: the same function in fewer passes and kernels per step.
        - every transformer layer folds its LayerScale into the weights that end its residual
          branches (TransformerLayer.fold_layer_scale_), so the adds run inside the GEMMs;
        - the quantizer's weight-normed projections become plain weights, computed once here
          instead of on every decode (~40 small kernels a step), and its decode one gather and
          one sum over a table of every codebook entry already projected to the output
          (ResidualLFQ.freeze_decode_table_: 3 kernels a step instead of ~50);
        - on a GPU, every layer's LayerNorms and GELU run as `fusion` says (codec.transformer
          FUSIONS: the one-pass norm kernel, cuBLASLt's GELU epilogue, or the Triton GEMMs;
          TransformerLayer.fuse_), so call this once the codec is on its device. Where those
          kernels cannot run (CPU) the layers stay as loaded; the fusion that runs is logged;
        - every attention layer runs its streaming steps with `ring_kernel` (codec.transformer
          RING_KERNELS: the split kernels or the fused one; Attention.use_ring_kernel_); where
          no Triton kernel runs (CPU) the torch reference runs either way; logged as well;
        - on a GPU, steps of at most `small_gemm_rows` tokens at a stage run every layer's GEMMs as
          kernels/fused_linear.py's (TransformerLayer.small_gemm_; 0 = never), logged;
        - decode states made from now on (new_decode_state) keep their rings as `ring_dtype` says
          (codec.transformer.RING_DTYPES: the codec's dtype, or fp8 e4m3, an approximation).
        Rounding differs from the loaded form, and the quantizer's on-disk names (original0/1)
        are gone from state_dict. Idempotent; returns self."""
        if ring_kernel not in RING_KERNELS:  # before any layer changes
            raise ValueError(f"ring_kernel must be one of {RING_KERNELS}, got {ring_kernel!r}")
        check_small_gemm_rows(small_gemm_rows)  # before any layer changes
        self._check_ring_dtype(ring_dtype)
        self.ring_dtype = ring_dtype
        running, ring_running, small_running = set(), set(), set()
        for module in self.modules():
            if isinstance(module, TransformerLayer):
                module.fold_layer_scale_()
                running.add(module.fuse_(fusion))
                ring_running.add(module.self_attn.use_ring_kernel_(ring_kernel))
                small_running.add(module.small_gemm_(small_gemm_rows))
        self.quantizer.freeze_weight_norm_()
        self.quantizer.freeze_decode_table_()
        log.info("codec serving form: fusion %s asked, %s runs; ring kernel %s asked, %s runs; small-GEMM rows %d "
                 "asked, %s run; rings %s", fusion, ", ".join(sorted(running)) or "none", ring_kernel,
                 ", ".join(sorted(ring_running)) or "none", small_gemm_rows, ", ".join(map(str, sorted(small_running))),
                 ring_dtype)
        return self

    def _check_ring_dtype(self, ring_dtype: str) -> None:
        if ring_dtype not in RING_DTYPES:
            raise ValueError(f"ring_dtype must be one of {RING_DTYPES}, got {ring_dtype!r}")
        device = self._param(self.decoder).device
        if ring_dtype == "fp8_e4m3" and lacks_fp8(device):
            raise ValueError(f"ring_dtype='fp8_e4m3' needs a GPU of compute capability {FP8_MIN_CAPABILITY} or "
                             f"newer (Ada, Hopper); {device} is {torch.cuda.get_device_capability(device)}: use 'auto'")

    def _param(self, stack: nn.ModuleList) -> torch.Tensor:
        for param in stack.parameters():
            return param
        raise RuntimeError("this codec was loaded without that half (load_codec parts=...): the encoder "
                           "encodes, the decoder decodes")

    # ---------------------------------------------------------------- encode
    @torch.no_grad()
    def encode(self, audio: torch.Tensor, lengths: torch.Tensor | None = None,
               n_quantizers: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
        """audio [B, 2, S] -> (codes [B, T, n_quantizers] long, code_lengths [B] long), T = ceil(S/3840).

        code_lengths = floor(lengths / 3840), as upstream: a final partial frame is quantized from
        a zeroed residual (padding codes), so only whole frames carry audio. The codes tensor
        still has ceil(S / 3840) frames.
        """
        self.quantizer.check_n_quantizers(n_quantizers)
        if audio.dim() != 3 or audio.shape[1] != self.channels or audio.shape[-1] == 0:
            raise ValueError(f"audio must have shape [B, {self.channels}, S>0], got {tuple(audio.shape)}")
        b, _, s = audio.shape
        spf = self.samples_per_frame
        frames = -(-s // spf)
        if lengths is None:
            lengths = torch.full((b,), s, dtype=torch.long, device=audio.device)
        p = self._param(self.encoder)
        x = torch.nn.functional.pad(audio.to(p.dtype), (0, frames * spf - s))
        x = interleave(x)
        for module in self.encoder:
            x = module(x)
        code_lengths = torch.div(lengths.to(audio.device), spf, rounding_mode="floor")
        return self.quantizer.encode(x, code_lengths, n_quantizers), code_lengths

    # ---------------------------------------------------------------- decode
    def _check_codes(self, codes: torch.Tensor) -> None:
        if codes.dim() != 3 or codes.dtype not in (torch.long, torch.int32):
            raise ValueError(f"codes must be an integer tensor [B, T, n_q], got {codes.dtype} {tuple(codes.shape)}")
        self.quantizer.check_n_quantizers(codes.shape[-1])

    def _decode_stack(self, codes: torch.Tensor, state: CodecDecodeState | None = None,
                      rows: torch.Tensor | None = None, frames: torch.Tensor | None = None,
                      packing: Packing | None = None) -> torch.Tensor:
        """Offline without a state; streaming: the state `rows` continue from `frames` [n] (their
        frame counters before this step); packed: codes [1, N, n_q] laid out by `packing`."""
        p = self._param(self.decoder)
        if codes.shape[1] == 0:
            return torch.zeros(codes.shape[0], self.channels, 0, device=codes.device, dtype=p.dtype)
        x = self.quantizer.decode(codes.long()).to(p.dtype)
        layer = 0
        for module, scale in zip(self.decoder, self._decoder_scales):
            if state is None or not isinstance(module, ProjectedTransformer):
                x = module(x)
                continue
            n = module.stage.num_layers
            x = module(x, state.caches[layer:layer + n], rows, frames * scale, packing)
            layer += n
        return deinterleave(x, self.channels)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Offline decode: codes [B, T, n_q] -> audio [B, 2, T * 3840]."""
        self._check_codes(codes)
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.codebook_size})")
        return self._decode_stack(codes)

    def new_decode_state(self, batch_size: int, device: torch.device | str | None = None,
                         dtype: torch.dtype | None = None, ring_dtype: str | None = None) -> CodecDecodeState:
        """Rings for `batch_size` streams on `device` (the decoder's), for a codec computing in
        `dtype` (the decoder's), stored as `ring_dtype` says (None: serving_form_'s; RING_DTYPES)."""
        p = self._param(self.decoder)
        shapes = [(s.num_heads, s.context, s.head_dim) for s in self.config.decoder
                  if isinstance(s, TransformerStage) for _ in range(s.num_layers)]
        ring_dtype = ring_dtype or self.ring_dtype
        self._check_ring_dtype(ring_dtype)
        return CodecDecodeState.empty(batch_size, shapes, torch.device(device) if device else p.device,
                                      cache_dtype(ring_dtype, dtype or p.dtype))

    @torch.no_grad()
    def decode_step(self, codes: torch.Tensor, state: CodecDecodeState,
                    rows: torch.Tensor | None = None) -> torch.Tensor:
        """Streaming decode of the next T frames of the state rows `rows`: codes [n, T, n_q] ->
        audio [n, 2, T*3840]. rows [n] (distinct slots; None = every row in order) continue
        their streams in place: each row's ring buffers are read at its slot and only its new
        keys are written back; other rows are not touched. No host-device synchronisation
        happens here, so the call can be CUDA-graph captured; codes and rows are not
        range-checked for that reason: the caller checks them (vocoder/step_buffers.check_codes).
        In the serving form a code past its codebook would read the next codebook's entries
        (ResidualLFQ.freeze_decode_table_), not fail.
        """
        self._check_codes(codes)
        device = state.frames.device
        if rows is None:
            if codes.shape[0] != state.batch_size:
                raise ValueError(f"codes batch {codes.shape[0]} != state batch {state.batch_size} (pass rows)")
            rows = torch.arange(state.batch_size, device=device)
        rows = rows.to(device=device, dtype=torch.long)
        if rows.shape != (codes.shape[0],):
            raise ValueError(f"rows must have shape [{codes.shape[0]}] (one per codes row), got {tuple(rows.shape)}")
        frames = state.frames.index_select(0, rows)
        audio = self._decode_stack(codes.to(device), state, rows, frames)
        # A put, not an add: rows repeated (CUDA-graph padding on one scratch row) advance once.
        state.frames.index_put_((rows,), frames + codes.shape[1])
        return audio

    @torch.no_grad()
    def decode_step_packed(self, codes: torch.Tensor, state: CodecDecodeState, rows: torch.Tensor,
                           packing: Packing) -> torch.Tensor:
        """Streaming decode of rows that bring different frame counts, in one step: codes [N, n_q]
        hold every row's next frames back to back as `packing` says (row i: lengths[i] frames from
        starts[i]) -> audio [2, N*3840], row i's at samples starts[i]*3840 .. (starts[i] +
        lengths[i])*3840. rows [n] are the state rows (repeats only with length 0: padding).
        Every decoder op but attention works token by token, and attention keeps to each row's
        own tokens and ring (kernels/window_attention.py), so a row decodes exactly as it would
        alone. Capturable like decode_step (nothing read back, nothing range-checked: the caller
        checks codes, as for decode_step)."""
        if codes.dim() != 2 or codes.dtype not in (torch.long, torch.int32):
            raise ValueError(f"codes must be an integer tensor [N, n_q], got {codes.dtype} {tuple(codes.shape)}")
        self.quantizer.check_n_quantizers(codes.shape[-1])
        if codes.shape[0] != packing.num_frames or rows.shape != packing.starts.shape:
            raise ValueError(f"packing covers {packing.num_frames} frames of {tuple(packing.starts.shape)} rows; "
                             f"got codes for {codes.shape[0]} frames and rows {tuple(rows.shape)}")
        frames = state.frames.index_select(0, rows)
        audio = self._decode_stack(codes[None], state, rows, frames, packing.at(frames))[0]
        state.frames.index_put_((rows,), frames + packing.lengths)
        return audio
