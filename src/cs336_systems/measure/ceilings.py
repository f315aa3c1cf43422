"""The device's two ceilings, measured in the job that needs them (METHOD: measure them once on
the machine, never take a datasheet's): a large bf16 matrix product's FLOP rate and a large
device-to-device copy's bandwidth (bytes read plus bytes written)."""

from __future__ import annotations

import torch

from cs336_systems.measure.timing import benchmark_ms

GIB = 2**30


def matmul_tflops(device: torch.device, n: int = 8192, dtype: torch.dtype = torch.bfloat16
                  ) -> float:
    """TFLOP/s of an (n x n) @ (n x n) product on random inputs (2 n^3 FLOPs)."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    ms = benchmark_ms(lambda: a @ b, device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def copy_gbps(device: torch.device, gib: float = 2.0) -> float:
    """GB/s (1e9 bytes) of a copy of `gib` GiB within the device, counting the bytes read and
    the bytes written."""
    n = int(gib * GIB) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = benchmark_ms(lambda: dst.copy_(src), device)
    return 2 * n * 4 / (ms * 1e-3) / 1e9
