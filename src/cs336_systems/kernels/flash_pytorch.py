"""FlashAttention-2 in plain PyTorch: tiled forward with online softmax, backward by recomputation.

Shapes: q (batch, n_queries, d), k and v (batch, n_keys, d), the same as the Triton kernels
accept (`checks.check_attention_inputs`): any n_queries, n_keys >= 1 and 1 <= d <= 256. The
causal mask is SDPA's `is_causal=True`: query i sees keys 0..i, aligned at the top left.
The forward walks query tiles of Q_TILE rows and, inside, key tiles of K_TILE rows (the last
tile of each may be shorter), keeping a running row max m, row sum l and un-normalized output
(FlashAttention-2, Algorithm 1). It saves only the logsumexp
L = m + log(l), of shape (batch, n_queries), beside q, k, v and o. The backward recomputes
P = exp(S - L) from L (Algorithm 2, untiled) and runs under `torch.compile`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cs336_systems.kernels.checks import check_attention_inputs

Q_TILE = 64
K_TILE = 64
CAUSAL_MASK_VALUE = -1e6  # added to masked scores, as the assignment specifies


def causal_bias(n_queries: int, n_keys: int, q_start: int, k_start: int, device) -> Tensor:
    """(n_queries, n_keys): 0 where query position >= key position, else -1e6. Positions count
    from the first query and the first key (SDPA's top-left alignment)."""
    q_pos = torch.arange(q_start, q_start + n_queries, device=device)[:, None]
    k_pos = torch.arange(k_start, k_start + n_keys, device=device)[None, :]
    return torch.where(q_pos >= k_pos, 0.0, CAUSAL_MASK_VALUE)


def flash_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                  q_tile: int = Q_TILE, k_tile: int = K_TILE) -> tuple[Tensor, Tensor]:
    """Returns o (like q) and the logsumexp L (batch, n_queries) in fp32."""
    batch, n_queries, d = q.shape
    n_keys = k.shape[1]
    scale = 1.0 / math.sqrt(d)
    q_tile, k_tile = min(q_tile, n_queries), min(k_tile, n_keys)
    o = torch.empty_like(q)
    logsumexp = torch.empty(batch, n_queries, device=q.device, dtype=torch.float32)
    for q_start in range(0, n_queries, q_tile):                         # Alg. 1, line 3
        q_i = q[:, q_start:q_start + q_tile].float()                    # (batch, Bq, d)
        rows = q_i.shape[1]
        row_max = torch.full((batch, rows), float("-inf"), device=q.device)
        row_sum = torch.zeros(batch, rows, device=q.device)
        acc = torch.zeros(batch, rows, d, device=q.device)
        # with a causal mask, key tiles past the last query of this tile contribute nothing
        k_end = min(n_keys, q_start + rows) if is_causal else n_keys
        for k_start in range(0, k_end, k_tile):                         # line 6
            k_j = k[:, k_start:k_start + k_tile].float()                # (batch, Bk, d)
            v_j = v[:, k_start:k_start + k_tile].float()
            scores = q_i @ k_j.transpose(-1, -2) * scale                # line 8: (batch, Bq, Bk)
            if is_causal:
                scores = scores + causal_bias(rows, k_j.shape[1], q_start, k_start, q.device)
            new_max = torch.maximum(row_max, scores.amax(dim=-1))       # line 9
            p = torch.exp(scores - new_max[..., None])
            correction = torch.exp(row_max - new_max)
            row_sum = correction * row_sum + p.sum(dim=-1)
            acc = correction[..., None] * acc + p @ v_j                 # line 10
            row_max = new_max
        o[:, q_start:q_start + rows] = (acc / row_sum[..., None]).to(q.dtype)  # line 12
        logsumexp[:, q_start:q_start + rows] = row_max + torch.log(row_sum)   # line 13
    return o, logsumexp


def flash_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, logsumexp: Tensor,
                   grad_o: Tensor, is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV by recomputing P from L (FlashAttention-2, Algorithm 2, untiled), in fp32."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    q32, k32, v32, grad_o32 = q.float(), k.float(), v.float(), grad_o.float()
    delta = (grad_o32 * o.float()).sum(dim=-1)                          # D = rowsum(dO * O)
    scores = q32 @ k32.transpose(-1, -2) * scale                        # (batch, Nq, Nk)
    if is_causal:
        scores = scores + causal_bias(q.shape[1], k.shape[1], 0, 0, q.device)
    p = torch.exp(scores - logsumexp[..., None])
    grad_v = p.transpose(-1, -2) @ grad_o32
    grad_p = grad_o32 @ v32.transpose(-1, -2)
    grad_s = p * (grad_p - delta[..., None])
    grad_q = grad_s @ k32 * scale
    grad_k = grad_s.transpose(-1, -2) @ q32 * scale
    return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype)


_compiled_backward = None


def compiled_flash_backward(*args) -> tuple[Tensor, Tensor, Tensor]:
    """`flash_backward` under torch.compile (compiled on first use, dynamic in shape)."""
    global _compiled_backward
    if _compiled_backward is None:
        _compiled_backward = torch.compile(flash_backward, dynamic=True)
    return _compiled_backward(*args)


class FlashAttentionPytorch(torch.autograd.Function):
    """`FlashAttentionPytorch.apply(q, k, v, is_causal=False)` -> o, with q, k, v (batch, seq, d)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        check_attention_inputs(q, k, v)
        o, logsumexp = flash_forward(q, k, v, is_causal)
        ctx.save_for_backward(logsumexp, q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, grad_o: Tensor):
        logsumexp, q, k, v, o = ctx.saved_tensors
        grad_q, grad_k, grad_v = compiled_flash_backward(q, k, v, o, logsumexp, grad_o,
                                                         ctx.is_causal)
        return grad_q, grad_k, grad_v, None
