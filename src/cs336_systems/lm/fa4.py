"""FlashAttention-4 (the optional package `flash-attn-4`, CuTe DSL kernels for Hopper and
Blackwell) as two custom operators, `cs336::fa4_fwd` and `cs336::fa4_bwd`, so that
torch.compile sees one opaque call each way; traced as it is, the package's Python breaks a
compiled graph a dozen times a call. The registry's `fa4` calls it (`lm.attention`).

    o = fa4_attention(q, k, v, is_causal)    # (batch, heads, seq, d) or (batch, seq, d)

The operators take (batch, seq, heads, d) contiguous q, k and v, the kernels' layout; the
forward returns o in that layout and the logsumexp (batch, heads, seq) in fp32, which the
backward reads.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _forward_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    batch, seq, heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, heads, seq), dtype=torch.float32)


@torch.library.custom_op("cs336::fa4_fwd", mutates_args=())
def fa4_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    from flash_attn.cute.interface import _flash_attn_fwd
    out, lse = _forward_outputs(q)
    _flash_attn_fwd(q, k, v, causal=is_causal, return_lse=True, out=out, lse=lse)
    return out, lse


@fa4_fwd.register_fake
def _fa4_fwd_fake(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    return _forward_outputs(q)


@torch.library.custom_op("cs336::fa4_bwd", mutates_args=())
def fa4_bwd(q: Tensor, k: Tensor, v: Tensor, out: Tensor, grad_out: Tensor, lse: Tensor,
            is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    from flash_attn.cute.interface import _flash_attn_bwd
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    _flash_attn_bwd(q, k, v, out, grad_out, lse, None, is_causal, dq=dq, dk=dk, dv=dv)
    return dq, dk, dv


@fa4_bwd.register_fake
def _fa4_bwd_fake(q: Tensor, k: Tensor, v: Tensor, out: Tensor, grad_out: Tensor, lse: Tensor,
                  is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, is_causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal = is_causal
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out: Tensor, _grad_lse) -> tuple[Tensor | None, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.cs336.fa4_bwd(q, k, v, out, grad_out.contiguous(), lse,
                                         ctx.is_causal)
    return dq, dk, dv, None


fa4_fwd.register_autograd(_backward, setup_context=_setup_context)


def fa4_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """Attention through FlashAttention-4: (batch, heads, seq, d) inputs, or (batch, seq, d)
    ones as one head, made (batch, seq, heads, d) contiguous for the kernels (a copy of each of
    q, k, v where the model's views are strided), the output viewed back."""
    if q.dim() == 3:
        q, k, v = (t[:, :, None].contiguous() for t in (q, k, v))
        return torch.ops.cs336.fa4_fwd(q, k, v, is_causal)[0][:, :, 0]
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return torch.ops.cs336.fa4_fwd(q, k, v, is_causal)[0].transpose(1, 2)
