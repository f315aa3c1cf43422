"""Kernels: FlashAttention-2 in PyTorch and Triton, and the Triton weighted sum.

The names below are imported on first use: `kernels.checks` (shape checks) loads no Triton.
"""

from cs336_systems.lazy import lazy_exports

EXPORTS = {
    "FlashAttentionPytorch": "cs336_systems.kernels.flash_pytorch",
    "FlashAttentionTriton": "cs336_systems.kernels.flash_triton",
    "FlashAttentionTritonTorchBackward": "cs336_systems.kernels.flash_triton",
    "WeightedSumFn": "cs336_systems.kernels.weighted_sum",
    "weighted_sum": "cs336_systems.kernels.weighted_sum",
}
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
__all__ = list(EXPORTS)
