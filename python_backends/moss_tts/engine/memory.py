"""The device memory budget: weights + KV cache + activation reserve must fit before allocating."""

from __future__ import annotations

import logging

import torch

from ..model import MossTTSLocalModel
from .config import ACTIVATION_RESERVE_GIB, EngineConfig, EngineConfigError

log = logging.getLogger(__name__)

GIB = 2**30


def check_memory_budget(config: EngineConfig, model: MossTTSLocalModel, kv_bytes: int,
                        device: torch.device) -> None:
    """Raise EngineConfigError, with the numbers and a remedy, if the KV cache would not fit.

    Budget = gpu_memory_utilization x device memory - reserved_memory_gib (colocated stages)
    - what the device already holds (the weights, other processes) - ACTIVATION_RESERVE_GIB
    (graph pool, prefill activations).
    """
    torch.cuda.empty_cache()  # cached-but-free blocks (e.g. from building the weights) are not in use
    free, total = torch.cuda.mem_get_info(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    in_use = total - free
    budget = (config.gpu_memory_utilization * total - config.reserved_memory_gib * GIB - in_use
              - ACTIVATION_RESERVE_GIB * GIB)
    log.info("memory plan: device %.1f GiB, in use %.1f GiB (weights %.1f GiB), KV cache %.1f GiB, "
             "activation reserve %.1f GiB, colocated reserve %.1f GiB, utilization %.2f",
             total / GIB, in_use / GIB, weights / GIB, kv_bytes / GIB, ACTIVATION_RESERVE_GIB,
             config.reserved_memory_gib, config.gpu_memory_utilization)
    if kv_bytes > budget:
        raise EngineConfigError(
            f"the KV cache needs {kv_bytes / GIB:.1f} GiB (max_running_requests="
            f"{config.max_running_requests} x max_seq_len={config.max_seq_len}, prefix_cache_rows="
            f"{config.prefix_cache_rows}) but the budget leaves "
            f"{max(budget, 0) / GIB:.1f} GiB ({config.gpu_memory_utilization:.2f} x {total / GIB:.1f} GiB, "
            f"less {in_use / GIB:.1f} GiB in use, {config.reserved_memory_gib:.1f} GiB reserved, "
            f"{ACTIVATION_RESERVE_GIB:.1f} GiB activations); lower max_running_requests, "
            f"max_seq_len or prefix_cache_rows, or raise gpu_memory_utilization")
