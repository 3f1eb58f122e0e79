"""The device memory budget: weights + KV cache + activation reserve must fit before allocating."""

from __future__ import annotations

import logging

import torch

from ..model.tts_model import MossTTSLocalModel
from .config import ACTIVATION_RESERVE_GIB, EngineConfig, EngineConfigError

log = logging.getLogger(__name__)

GIB = 2**30


def check_memory_budget(config: EngineConfig, model: MossTTSLocalModel, kv_bytes: int,
                        device: torch.device) -> None:
    """Raise EngineConfigError, with the numbers and a remedy, if the KV cache would not fit.

    Budget = gpu_memory_utilization x device memory - reserved_memory_gib (the stages that share
    the GPU: vocoder, ref_encoder) - what this process holds (the weights) - ACTIVATION_RESERVE_GIB
    (graph pool, prefill activations). Other processes' memory is not subtracted: Triton loads the
    models in parallel, so whether the vocoder is already there is chance, and the plan must not
    depend on it (reserved_memory_gib stands for them; a warning says when they hold more).
    """
    torch.cuda.empty_cache()  # cached-but-free blocks (e.g. from building the weights) are not in use
    free, total = torch.cuda.mem_get_info(device)
    own = torch.cuda.memory_reserved(device)
    others = max(total - free - own, 0)  # other processes and CUDA contexts
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    reserved = config.reserved_memory_gib * GIB
    budget = config.gpu_memory_utilization * total - reserved - own - ACTIVATION_RESERVE_GIB * GIB
    log.info("memory plan: device %.1f GiB x utilization %.2f; this engine holds %.1f GiB (weights %.1f GiB), "
             "KV cache %.1f GiB, activation reserve %.1f GiB; reserved for colocated stages %.1f GiB "
             "(other processes hold %.1f GiB now)", total / GIB, config.gpu_memory_utilization, own / GIB,
             weights / GIB, kv_bytes / GIB, ACTIVATION_RESERVE_GIB, config.reserved_memory_gib, others / GIB)
    if others > reserved + GIB:
        log.warning("other processes hold %.1f GiB of this GPU, more than reserved_memory_gib=%.1f: raise it "
                    "(or lower gpu_memory_utilization) so they do not run out", others / GIB,
                    config.reserved_memory_gib)
    if kv_bytes > budget:
        raise EngineConfigError(
            f"the KV cache needs {kv_bytes / GIB:.1f} GiB (max_running_requests="
            f"{config.max_running_requests} x max_seq_len={config.max_seq_len}, prefix_cache_rows="
            f"{config.prefix_cache_rows}) but the budget leaves "
            f"{max(budget, 0) / GIB:.1f} GiB ({config.gpu_memory_utilization:.2f} x {total / GIB:.1f} GiB, "
            f"less {own / GIB:.1f} GiB this engine holds, {config.reserved_memory_gib:.1f} GiB reserved, "
            f"{ACTIVATION_RESERVE_GIB:.1f} GiB activations); lower max_running_requests, "
            f"max_seq_len or prefix_cache_rows, or raise gpu_memory_utilization (or lower "
            f"reserved_memory_gib when less shares the GPU)")
