"""Kernels: FlashAttention-2 in PyTorch, Triton, and Gluon for Hopper, the fused AdamW's pass
(its optimizer is `lm.fused_adamw.FusedAdamW`), the Triton weighted sum.

The names below are imported on first use: `kernels.checks` (shape checks) loads no Triton.
On a machine without CUDA, importing this package sets TRITON_INTERPRET=1 (unless set), so that
every kernel module, imported after it, runs in Triton's interpreter.
"""

from cs336_systems.kernels.checks import interpret_without_cuda
from cs336_systems.lazy import lazy_exports

interpret_without_cuda()

EXPORTS = {  # module: the names it defines
    "cs336_systems.kernels.flash_pytorch": ("FlashAttentionPytorch",),
    "cs336_systems.kernels.flash_triton": (
        "FlashAttentionTriton", "FlashAttentionTritonTorchBackward"),
    "cs336_systems.kernels.flash_gluon": (
        "FlashAttentionGluon", "flash_gluon_forward", "flash_gluon_backward"),
    "cs336_systems.kernels.weighted_sum": ("WeightedSumFn", "weighted_sum"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
