"""Host-to-device copies that never wait for the device.

`tensor.to(cuda)` or `cuda_tensor.copy_(cpu_tensor)` from pageable host memory is a blocking
copy: torch waits for the current stream to drain first. On a thread that keeps a step in flight
(the engine launches step N+1 before it reads step N; the vocoder launches round k+1 before it
lands round k) that wait is a whole step, once per call. So every small upload on a hot path goes
through pinned memory and a non-blocking copy; the caching host allocator keeps the pinned block
until the copy has read it.
"""

from __future__ import annotations

import torch


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`, enqueued on the current stream without waiting."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def upload_index(values: list, device: torch.device) -> torch.Tensor:
    """A list of ints as an int64 tensor on `device`: filled through numpy in pinned memory, so
    two torch calls in all (each gives up the GIL on a busy thread)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=torch.long, device=device)
    host = torch.empty(len(values), dtype=torch.long, pin_memory=True)
    host.numpy()[:] = values
    return host.to(device, non_blocking=True)
