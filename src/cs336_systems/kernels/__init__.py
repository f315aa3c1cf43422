"""Attention kernels: FlashAttention-2 in PyTorch and Triton, and the Triton warm-up."""

from cs336_systems.kernels.flash_pytorch import FlashAttentionPytorch
from cs336_systems.kernels.flash_triton import FlashAttentionTriton, FlashAttentionTritonTorchBackward
from cs336_systems.kernels.weighted_sum import WeightedSumFn, weighted_sum

__all__ = ["FlashAttentionPytorch", "FlashAttentionTriton", "FlashAttentionTritonTorchBackward",
           "WeightedSumFn", "weighted_sum"]
