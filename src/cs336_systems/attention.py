"""Attention implementations the model can plug in.

Every implementation has the signature `attention(q, k, v, is_causal) -> out` with q, k, v and
out of shape (..., seq, d_head). Register new ones (annotated, compiled, FlashAttention) in
`ATTENTION_IMPLEMENTATIONS` so configs and CLIs can name them.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class AttentionFn(Protocol):
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor: ...


def eager_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, written out in plain PyTorch ops."""
    d_head = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (..., seq_q, seq_k)
    if is_causal:
        seq_q, seq_k = scores.shape[-2:]
        mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """PyTorch's fused scaled_dot_product_attention (the reference users would reach for)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _per_head(kernel, q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    """Run a (batch, seq, d) kernel over (..., seq, d) inputs by folding the leading dims."""
    lead = q.shape[:-2]
    fold = lambda t: t.reshape(-1, *t.shape[-2:])  # noqa: E731
    return kernel.apply(fold(q), fold(k), fold(v), is_causal).reshape(*lead, *q.shape[-2:])


def flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """FlashAttention-2, Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1)."""
    from cs336_systems.kernels.flash_triton import FlashAttentionTriton  # triton only when used
    return _per_head(FlashAttentionTriton, q, k, v, is_causal)


def flash_pytorch_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """FlashAttention-2, tiled PyTorch forward and compiled PyTorch backward."""
    from cs336_systems.kernels.flash_pytorch import FlashAttentionPytorch
    return _per_head(FlashAttentionPytorch, q, k, v, is_causal)


ATTENTION_IMPLEMENTATIONS: dict[str, Callable[..., Tensor]] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
    "flash": flash_attention,
    "flash-pytorch": flash_pytorch_attention,
}

# Sources a job must list when it runs an attention implementation that is imported lazily.
ATTENTION_SOURCES: dict[str, tuple[str, ...]] = {
    "flash": ("cs336_systems.kernels.flash_triton",),
    "flash-pytorch": ("cs336_systems.kernels.flash_pytorch",),
}


def get_attention(name: str) -> AttentionFn:
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"unknown attention {name!r}; allowed: "
                         f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return ATTENTION_IMPLEMENTATIONS[name]
