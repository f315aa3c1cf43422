"""Reading the CUDA caching allocator: the one place jobs measure memory.

Every reading is in GiB (2**30 bytes) and None on a device without allocator statistics (the
CPU), so a record says "not measured" rather than a made-up zero.

    reset_peak(device)
    ...run the steps...
    metrics["peak_gib"] = peak_gib(device)

`peak_window` reads a peak on any device: the allocator on a GPU, and on the CPU `LiveBytes`,
a stand-in that counts the bytes of live tensor storages (gradient_checkpointing's smoke runs).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from cs336_systems.measure.timing import synchronize

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


def alloc_retries(device: torch.device | str) -> int | None:
    """How often the CUDA allocator has failed an allocation, freed its cache and tried again
    (each time a device-wide synchronisation that leaves the GPU waiting for the host)."""
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if _is_cuda(device) \
        else None


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


# --- Peak memory without the CUDA allocator (gradient_checkpointing on CPU) -------------------

class LiveBytes(TorchDispatchMode):
    """The CPU stand-in for `torch.cuda.max_memory_allocated`: bytes of the tensor storages alive
    while the mode is on, and their peak.

        with LiveBytes(model.parameters()) as live:
            model(x).sum().backward()
        live.peak_bytes, live.start_bytes

    Every ATen op's outputs pass through `__torch_dispatch__`; an output whose storage is new
    (not one of the op's inputs' storages, so views and in-place results are not counted twice)
    adds the storage's bytes, and a weakref finalizer on the storage takes them off when it is
    freed. Storages' Python objects live as long as the storage itself (PyTorch preserves them),
    so the finalizer fires at the real free, whoever held the storage: a tensor, a view, or
    autograd's saved variables. On the CPU, backward runs on the calling thread, where the mode
    is on, so backward's allocations and frees are seen too (tests check both). `existing`
    tensors (parameters, optimizer state) count from the start. Not seen: scratch memory inside
    an op, the allocator's rounding and caching, and tensors made by other threads.
    """

    def __init__(self, existing: Iterable[torch.Tensor] = ()):
        super().__init__()
        self._existing = list(existing)
        self._sizes: dict[int, int] = {}         # storage key -> bytes counted
        self._finalizers: dict[int, weakref.finalize] = {}
        self._lock = threading.RLock()            # finalizers may run on another thread
        self.live_bytes = 0
        self.peak_bytes = 0
        self.start_bytes = 0

    def _track(self, storage: torch.UntypedStorage) -> None:
        key, size = storage._cdata, storage.nbytes()
        with self._lock:
            if key in self._sizes:                # seen before: follow a resize
                self.live_bytes += size - self._sizes[key]
                self._sizes[key] = size
            else:
                self._sizes[key] = size
                self._finalizers[key] = weakref.finalize(storage, self._free, key)
                self.live_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _free(self, key: int) -> None:
        with self._lock:
            self.live_bytes -= self._sizes.pop(key, 0)
            self._finalizers.pop(key, None)

    def __enter__(self):
        for tensor in self._existing:
            if torch.is_tensor(tensor):
                self._track(tensor.untyped_storage())
        self.start_bytes = self.peak_bytes = self.live_bytes
        return super().__enter__()

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        with self._lock:                          # frees after the window are not ours
            for finalizer in self._finalizers.values():
                finalizer.detach()
            self._finalizers.clear()
            self._sizes.clear()
        return result

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata
                  for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                storage = t.untyped_storage()
                if storage._cdata not in inputs or storage._cdata in self._sizes:
                    self._track(storage)
        return out


# What a record's peak was read from: `peak_source` in the checkpointing records.
PEAK_SOURCES = {"cuda": "cuda allocator", "cpu": "live tensor bytes (CPU stand-in)"}


@dataclass
class PeakReading:
    """Memory in use when a `peak_window` opened, and the most in use before it closed."""

    source: str
    start_bytes: int = 0
    peak_bytes: int = 0
    current: Callable[[], int] = lambda: 0   # memory in use now, while the window is open

    def current_bytes(self) -> int:
        return self.current()

    @property
    def start_gib(self) -> float:
        return self.start_bytes / GIB

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB


@contextmanager
def peak_window(device: torch.device | str, existing: Iterable[torch.Tensor] = ()
                ) -> Iterator[PeakReading]:
    """Peak memory over a block of code on any device: the CUDA allocator's peak (reset at the
    start) on a GPU, `LiveBytes` elsewhere, where `existing` (the tensors alive at the start:
    parameters, optimizer state) stands for the memory already in use."""
    device = torch.device(device)
    if _is_cuda(device):
        reading = PeakReading(PEAK_SOURCES["cuda"],
                              current=lambda: torch.cuda.memory_allocated(device))
        synchronize(device)
        reset_peak(device)
        reading.start_bytes = reading.current_bytes()
        yield reading
        synchronize(device)
        reading.peak_bytes = round(peak_gib(device) * GIB)
        return
    reading = PeakReading(PEAK_SOURCES["cpu"])
    with LiveBytes(existing) as live:
        reading.start_bytes = live.start_bytes
        reading.current = lambda: live.live_bytes
        yield reading
    reading.peak_bytes = live.peak_bytes


def peak_reserved_gib(device: torch.device | str) -> float | None:
    """Most memory the caching allocator held from the device (tensors, plus blocks cached for
    reuse and the rounding of each block) at any moment since the last `reset_peak`."""
    return torch.cuda.max_memory_reserved(device) / GIB if _is_cuda(device) else None
