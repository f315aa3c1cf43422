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


ATTENTION_IMPLEMENTATIONS: dict[str, Callable[..., Tensor]] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
}


def get_attention(name: str) -> AttentionFn:
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"unknown attention {name!r}; allowed: "
                         f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return ATTENTION_IMPLEMENTATIONS[name]
