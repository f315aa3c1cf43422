"""Reading the CUDA caching allocator: the one place jobs measure memory.

Every reading is in GiB (2**30 bytes) and None on a device without allocator statistics (the
CPU), so a record says "not measured" rather than a made-up zero.

    reset_peak(device)
    ...run the steps...
    metrics["peak_gib"] = peak_gib(device)
"""

from __future__ import annotations

import torch

GIB = 2**30


def _is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def reset_peak(device: torch.device | str) -> None:
    """Start a new peak window (the peak since the last reset is what `peak_gib` reads)."""
    if _is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device | str) -> float | None:
    """Most memory held by tensors at any moment since the last `reset_peak`."""
    return torch.cuda.max_memory_allocated(device) / GIB if _is_cuda(device) else None


def peak_reserved_gib(device: torch.device | str) -> float | None:
    """Most memory the allocator reserved from the driver since the last `reset_peak`."""
    return torch.cuda.max_memory_reserved(device) / GIB if _is_cuda(device) else None


def allocated_gib(device: torch.device | str) -> float | None:
    """Memory held by tensors now."""
    return torch.cuda.memory_allocated(device) / GIB if _is_cuda(device) else None


def tensor_bytes(tensors) -> int:
    """Bytes of the tensors' elements (non-tensors are skipped): what they take, by count."""
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))
