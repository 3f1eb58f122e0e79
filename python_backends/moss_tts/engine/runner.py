"""ModelRunner: owns every tensor of the engine (KV cache, slot state, step outputs, graphs) and
launches steps. It makes no policy decisions: the scheduler's CacheManager names the slots, the
prefix blocks to load and store and the decode's key window; the runner moves the tensors
(padding shapes to its graphs' buckets).

A step (run_step) = the batched prefill of the prompts staged since the last step (stage_prompt;
each samples its first frame) + one decode step over the running slots (each samples its next
frame), launched without waiting for anything, then one device->host copy of the step's output
rows. The caller reads the output later (StepOutput.wait), typically after launching the next step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch.nn.attention import sdpa_kernel

from ..contract.sampling_params import SamplingParams
from ..kernels import decode_attention, kv_format, prefill_attention, sample_kernel, step_qkv
from ..kernels.fused import Fusions
from ..kernels.uploads import to_device, upload_index
from ..model.tts_model import MossTTSLocalModel
from . import backbone, step
from .buckets import Buckets
from .cache_manager import PrefixStore, StepPlan
from .config import EngineConfig
from .frame import LocalRope
from .graph_runner import REMEDIES, GraphCaptureError, GraphRunner
from .kv_cache import StaticKVCache
from .memory import check_memory_budget
from .prefix_cache import PrefixMatch
from .prefill_batch import StagedPrompt, prefill_inputs, prefill_plan
from .slot_state import SlotState, param_rows
from .stats import GraphUse
from .step import PrefillInputs, StepContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepOutput:
    """Host copy of one step's rows [emitted, 12 codes]: the prompt prefilled into slot
    prefill_slots[i] at row i (the runner's order, not the staging order), the decode row of
    slot s at decode_offset + s."""

    host: np.ndarray  # a view of the runner's pinned buffer: valid until the step after next
    ready: Optional["torch.cuda.Event"]
    prefill_slots: list[int]
    decode_offset: int
    graph_use: GraphUse

    def wait(self) -> np.ndarray:
        """The rows [num_rows, 1 + n_vq] int64, once the device wrote them: a view that the step
        after next overwrites (the engine reads it before it launches that step)."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host


class ModelRunner:
    def __init__(self, model: MossTTSLocalModel, config: EngineConfig) -> None:
        self.model, self.config = model, config
        self.device = model.local_text_lm_head.weight.device
        self.dtype, self.kv_dtype = model.dtype, kv_format.cache_dtype(config.kv_cache_dtype, model.dtype)
        b = model.cfg.backbone
        config.check_model(self.device, self.dtype, b.max_position_embeddings)
        # One slot more than the scheduler hands out: the scratch slot, where the padding
        # prompts of a batched prefill (to a graph's bucket) write and are forgotten.
        self.scratch_slot = config.max_running_requests
        self.kv = StaticKVCache(b.num_hidden_layers, config.max_running_requests + 1, config.max_seq_len,
                                b.num_key_value_heads, b.head_dim, config.prefix_blocks, config.prefix_block_rows)
        is_cuda = self.device.type == "cuda"
        self.buckets = Buckets.build(config.max_running_requests, config.max_seq_len,
                                     config.cuda_graph_max_batch, config.min_kv_bucket,
                                     config.cuda_graph_prefill_tokens, is_padded=is_cuda)
        self.uses_graphs = is_cuda and not config.enforce_eager
        self.ctx: Optional[StepContext] = None
        self.graphs: Optional[GraphRunner] = None
        self._staged: list[StagedPrompt] = []
        self._released: list[int] = []  # slots to mark idle on the device before the next step
        self._host_out: list[tuple[torch.Tensor, np.ndarray, "torch.cuda.Event"]] = []
        self._next_host = 0

    @property
    def is_ready(self) -> bool:
        return self.ctx is not None

    # ---- setup ----

    def setup(self) -> None:
        """Allocate all device state and capture the graphs once; safe to call twice."""
        if self.is_ready:
            return
        if self.device.type == "cuda":
            check_memory_budget(self.config, self.model, self.kv.num_bytes(self.kv_dtype), self.device)
        self.kv.setup(self.device, self.kv_dtype)
        with torch.inference_mode():
            backbone.merge_projections(self.model.transformer)
        cfg, slots = self.model.cfg, self.kv.num_slots
        fusions = Fusions.for_device(self.device, self.config.fuse_kernels)
        ctx = StepContext(self.model, self.kv, SlotState.allocate(slots, cfg, self.device), fusions,
                          LocalRope(self.model.local_transformer, cfg.n_vq + 1, self.device, self.dtype),
                          torch.arange(slots, device=self.device),
                          torch.zeros(2 * slots, 1 + cfg.n_vq, dtype=torch.long, device=self.device),
                          *self._kernels())
        if self.device.type == "cuda":
            with torch.inference_mode():
                try:
                    self._warm_up(ctx)
                except Exception as exc:  # e.g. a Triton or Inductor compile error: say what to try
                    raise GraphCaptureError(f"engine warm-up failed ({exc}). {REMEDIES}") from exc
                ctx.state.reset()
                if self.uses_graphs:
                    def prefix_prefill(inputs, window):
                        step.prefill_step(ctx, inputs, window=window)
                    self.graphs = GraphRunner(self.buckets)
                    self.graphs.capture(lambda s, k: step.decode_step(ctx, s, k),
                                        lambda inputs: step.prefill_step(ctx, inputs),
                                        self._dummy_inputs,
                                        prefix_prefill if self.config.prefix_blocks else None)
                ctx.state.reset()  # warm-up and capture runs wrote into slots
            # Step outputs land here, alternately, each with a blocking event (the engine sleeps on the
            # device, never spins: a real-time thread must not, thread_priority.py).
            for host in (torch.empty(ctx.out.shape, dtype=ctx.out.dtype, pin_memory=True) for _ in range(2)):
                self._host_out.append((host, host.numpy(), torch.cuda.Event(blocking=True)))
        self.ctx = ctx

    def _kernels(self) -> tuple[bool, bool, bool, bool, bool]:
        """(attention, sampler, qkv, local, prefill) kernels: each as configured and where it can run here."""
        b, c, cache = self.model.cfg.backbone, self.config, self.kv.k[0]
        query = torch.empty((1, b.num_attention_heads, b.head_dim), device=self.device, dtype=self.dtype)
        logits = torch.empty((1, self.model.cfg.audio_vocab_size), device=self.device, dtype=self.dtype)
        qkv, fits = step_qkv.is_supported(query), step_qkv.fits_decode(b.head_dim)
        return (c.attention_kernel and decode_attention.is_supported(query, cache),
                c.sampler_kernel and sample_kernel.is_supported(logits), c.qkv_kernels and qkv and fits,
                c.qkv_kernels and qkv, c.prefill_kernel and qkv and fits and prefill_attention.is_supported(query[None], cache))

    def _warm_up(self, ctx: StepContext) -> None:
        """Eager prefills (1, 2 and many prompts) and decode steps (1 and 2 slots), so the fused
        kernels of the eager paths compile, and the allocator holds a full prefill's
        activations, before the first request rather than during it."""
        cfg = self.config
        for n in range(1, min(2, cfg.max_running_requests) + 1):
            num_tokens = min(self.buckets.prefill_len(n, 16), cfg.max_seq_len - 1)
            step.prefill_step(ctx, self._dummy_inputs(n, num_tokens))
            step.decode_step(ctx, n, self.buckets.kv[0])
        rows = min(256, cfg.max_seq_len - 1, cfg.prefill_chunk_tokens)
        many = min(cfg.max_running_requests, max(1, cfg.prefill_chunk_tokens // rows))
        step.prefill_step(ctx, self._dummy_inputs(many, rows))
        torch.cuda.synchronize()

    def _dummy_inputs(self, num_prompts: int, num_tokens: int) -> PrefillInputs:
        host = PrefillInputs.empty(num_prompts, num_tokens, self.model.cfg.row_width, "cpu")
        _, slots, lengths, _, ints, floats = host.arrays()
        params_floats, params_ints = param_rows(SamplingParams(seed=0, max_frames=2))
        slots[:], lengths[:] = np.arange(num_prompts), num_tokens
        floats[:], ints[:] = params_floats, params_ints
        return host.to(self.device)

    # ---- slots ----

    def release_slot(self, slot: int) -> None:
        """The slot's request ended: drop its staged prompt, and the slot stops generating from
        the next step on. The device write waits for that step's launch (run_step),
        one fill for all of a step's ended slots: `active[slot] = False` from the host is a
        blocking copy of a pageable scalar, a wait for the step in flight (~20 ms at 256 rows)
        per ended request, which under a mixed load was ~45% of the engine thread's time."""
        self._staged = [p for p in self._staged if p.slot != slot]
        if self.ctx is not None:
            self._released.append(slot)

    # ---- steps ----

    def stage_prompt(self, slot: int, prompt_rows: torch.Tensor, params: SamplingParams,
                     prefix: Optional[PrefixMatch] = None, rows_of_params=None) -> None:
        """Queue a newly admitted prompt for the next step's batched prefill; `prefix` names the
        pool blocks to copy its first rows from; `rows_of_params`: param_rows(params), if known."""
        assert self.is_ready, "ModelRunner.setup() must run before stage_prompt"
        self._staged.append(StagedPrompt(slot, prompt_rows, params, prefix, rows_of_params))

    @torch.inference_mode()
    def run_step(self, plan: StepPlan) -> StepOutput:
        """Launch one step: the staged prefills, then one frame for each of plan.decode_slots,
        which must include every slot still generating. Returns without waiting for the device."""
        slots = plan.decode_slots
        assert self.is_ready and (slots or self._staged), "a step needs setup() and some work"
        staged, groups = prefill_plan(self._staged, self.config.prefill_chunk_tokens)
        self._staged = []
        use = GraphUse()
        released, loads, stores = self._released, self._load_pairs(staged), self._store_pairs(plan.stores)
        self._released = []
        deactivate, load_slots, load_pool, store_slots, store_pool = self._upload_indices(released, loads, stores)
        # Before any prefill: a slot released and handed out again in this step is reactivated
        # by its prompt's prefill, which must come after.
        if released:
            self.ctx.state.deactivate(deactivate)
        # Every reused prefix is copied in before any prefill of this step, and new blocks are
        # stored after all of them, so no copy reads a pool block a store of this step rewrote.
        self.kv.copy_prefixes(len(loads), load_slots, load_pool, True, self.ctx.prefill_kernel)
        for offset, group in groups:
            self._run_prefill(group, offset, use)
        self.kv.copy_prefixes(len(stores), store_slots, store_pool, False, self.ctx.prefill_kernel)
        num_rows = len(staged)
        if slots:
            self._run_decode(slots, plan.kv_len, use)
            num_rows = self.ctx.decode_offset + max(slots) + 1
        return self._download(num_rows, [p.slot for p in staged], use)

    def _load_pairs(self, staged: list[StagedPrompt]) -> list[tuple[int, int]]:
        """(slot block, pool block) of every reused prefix block of this step's prompts."""
        return [(self.kv.slot_block(p.slot, i), block) for p in staged if p.start
                for i, block in enumerate(p.prefix.pool_blocks)]

    def _store_pairs(self, stores: tuple[PrefixStore, ...]) -> list[tuple[int, int]]:
        return [(self.kv.slot_block(s.slot, s.index), s.pool_block) for s in stores]

    def _upload_indices(self, released: list[int], loads: list[tuple[int, int]],
                        stores: list[tuple[int, int]]) -> list[Optional[torch.Tensor]]:
        """The step's index tensors (slots to mark idle; slot and pool blocks of the prefix
        loads; of the stores) in one upload that never waits (uploads.py): 4 torch calls
        instead of ~5 per kind and chunk, each of which gives up the GIL on this thread and,
        under a mixed load, waits about a switch interval to win it back."""
        sizes = [len(released), len(loads), len(loads), len(stores), len(stores)]
        if not any(sizes):
            return [None] * len(sizes)
        values = (released + [s for s, _ in loads] + [b for _, b in loads]
                  + [s for s, _ in stores] + [b for _, b in stores])
        return list(upload_index(values, self.device).split(sizes))

    def _run_prefill(self, group: list[StagedPrompt], offset: int, use: GraphUse) -> None:
        ctx = self.ctx
        if len(group) == 1 and group[0].rows.shape[0] - group[0].start > self.config.prefill_chunk_tokens:
            hidden = self._prefill_long(group[0])
            step.prefill_step(ctx, self._inputs(group, 1, 1).to(self.device), offset, hidden)
            use.count_prefill(False, self.uses_graphs)
            return
        longest = max(p.rows.shape[0] - p.start for p in group)
        window = self._prefix_window(group)
        if len(group) == 1:
            num_prompts, num_tokens = 1, self.buckets.prefill_len(1, longest)
        else:
            num_prompts, num_tokens = self.buckets.batch_prefill_shape(len(group), longest, window)
        host = self._inputs(group, num_prompts, min(num_tokens, self.config.max_seq_len))
        # A graph writes its output rows from 0: the runner's plan puts the group it can
        # replay first (the shortest prompts), the others run eagerly at their offsets.
        if self.graphs is not None and offset == 0 and self.graphs.can_replay_prefill(host, window):
            self.graphs.replay_prefill(host, window)
            use.count_prefill(True, True)
            return
        step.prefill_step(ctx, host.to(self.device), offset, window=window)
        use.count_prefill(False, self.uses_graphs)

    def _prefix_window(self, group: list[StagedPrompt]) -> int:
        """0 when no prompt of the group reuses a prefix; else the key rows its prefill reads:
        the longest prompt padded to a KV bucket (the window of the graphs, so eager ==
        graphed)."""
        if not any(p.start for p in group):
            return 0
        return min(self.buckets.key_window(max(p.rows.shape[0] for p in group)), self.config.max_seq_len)

    def _prefill_long(self, prompt: StagedPrompt) -> torch.Tensor:
        rows = to_device(prompt.rows, self.device)
        chunk, model = self.config.prefill_chunk_tokens, self.model
        with sdpa_kernel(step.PREFILL_ATTENTION):
            for start in range(prompt.start, rows.shape[0], chunk):
                embeds = model.embed_rows(rows[start:start + chunk].unsqueeze(0)).to(self.dtype)
                hidden = backbone.prefill_chunk(model.transformer, self.ctx.fusions, self.kv, prompt.slot,
                                                embeds, start)
        return hidden

    def _inputs(self, group: list[StagedPrompt], num_prompts: int, num_tokens: int) -> PrefillInputs:
        return prefill_inputs(group, num_prompts, num_tokens, self.model.cfg, self.scratch_slot,
                              pin=self.device.type == "cuda")

    def _run_decode(self, slots: list[int], kv_len: int, use: GraphUse) -> None:
        """Slots [0, max(slots)] over key rows [0, kv_len), both padded up to a graph's bucket."""
        size, kv_len = self.buckets.decode_shape(max(slots) + 1, kv_len)
        if self.graphs is not None and self.graphs.can_replay_decode(size, kv_len):
            self.graphs.replay_decode(size, kv_len)
            use.count_decode(True, True)
        else:
            step.decode_step(self.ctx, size, kv_len)
            use.count_decode(False, self.uses_graphs)

    def _download(self, num_rows: int, prefill_slots: list[int], use: GraphUse) -> StepOutput:
        if self.device.type != "cuda":
            return StepOutput(self.ctx.out[:num_rows].numpy().copy(), None, prefill_slots,
                              self.ctx.decode_offset, use)
        # The whole output buffer (~50 KB), so no torch call slices it; into the pinned buffer
        # that the step before last used (the engine reads a step's rows before it launches the
        # step after next), with that buffer's event: two torch calls a step in all.
        host, array, ready = self._host_out[self._next_host]
        self._next_host ^= 1
        host.copy_(self.ctx.out, non_blocking=True)
        ready.record()
        return StepOutput(array[:num_rows], ready, prefill_slots, self.ctx.decode_offset, use)
