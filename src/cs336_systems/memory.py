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


def allocated_gib(device: torch.device | str) -> float | None:
    """Memory held by tensors now."""
    return torch.cuda.memory_allocated(device) / GIB if _is_cuda(device) else None


def tensor_bytes(tensors) -> int:
    """Bytes of the tensors' elements (non-tensors are skipped): what they take, by count."""
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


def device_gib(device: torch.device | str) -> float | None:
    """The device's total memory."""
    if not _is_cuda(device):
        return None
    return torch.cuda.get_device_properties(device).total_memory / GIB


def cap(device: torch.device | str, gib: float) -> float:
    """Let this process allocate at most `gib` of the device's memory (as if the card had that
    much; `torch.cuda.set_per_process_memory_fraction`). Returns the fraction set."""
    from cs336_systems.records import Skip

    total = device_gib(device)
    if total is None:
        raise Skip(f"a memory cap of {gib:g} GiB needs a CUDA device; this job runs on "
                   f"{torch.device(device).type}")
    fraction = min(1.0, gib / total)
    index = torch.device(device).index
    torch.cuda.set_per_process_memory_fraction(
        fraction, torch.cuda.current_device() if index is None else index)
    return fraction
