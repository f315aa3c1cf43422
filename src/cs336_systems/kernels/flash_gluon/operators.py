"""The custom operators torch.compile sees (`cs336::flash_gluon_fwd`, `cs336::flash_gluon_bwd`:
one opaque call each way) and the autograd function `FlashAttentionGluon`."""

from __future__ import annotations

import torch
from torch import Tensor

from cs336_systems.kernels.flash_gluon.host import (
    _backward, _rows, flash_gluon_backward, flash_gluon_forward,
)
from cs336_systems.kernels.flash_gluon.tiles import default_backward_schedule
from cs336_systems.kernels.launch import eager_on_plain_tensors


# --- custom operators (what torch.compile sees: one opaque call each way) and autograd -------

def _forward_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


@torch.library.custom_op("cs336::flash_gluon_fwd", mutates_args=())
def flash_gluon_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                    schedule: str | None) -> tuple[Tensor, Tensor]:
    return flash_gluon_forward(q, k, v, is_causal, schedule)


@flash_gluon_fwd.register_fake
def _flash_gluon_fwd_fake(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                          schedule: str | None) -> tuple[Tensor, Tensor]:
    return _forward_outputs(q)


@torch.library.custom_op("cs336::flash_gluon_bwd", mutates_args=())
def flash_gluon_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, grad_o: Tensor,
                    is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    return flash_gluon_backward(q, k, v, o, lse, grad_o, is_causal)


@flash_gluon_bwd.register_fake
def _flash_gluon_bwd_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                          grad_o: Tensor, is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _gradients(ctx, grad_o: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v, o, lse = ctx.saved_tensors
    if eager_on_plain_tensors(q, grad_o):   # checked by the forward
        return _backward(q, k, v, o, lse, grad_o, ctx.is_causal,
                         default_backward_schedule(q.shape[-1], q.shape[-2]))
    return torch.ops.cs336.flash_gluon_bwd(q, k, v, o, lse, grad_o, ctx.is_causal)


def _save(ctx, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, is_causal: bool) -> None:
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.is_causal = is_causal


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, is_causal, _ = inputs
    _save(ctx, q, k, v, *output, is_causal)
    ctx.mark_non_differentiable(output[1])  # the logsumexp is for the backward only


def _op_backward(ctx, grad_o: Tensor, _grad_lse) -> tuple[Tensor | None, ...]:
    return *_gradients(ctx, grad_o), None, None


flash_gluon_fwd.register_autograd(_op_backward, setup_context=_setup_context)


class FlashAttentionGluon(torch.autograd.Function):
    """`FlashAttentionGluon.apply(q, k, v, is_causal=False, schedule=None)` -> o, for
    (batch, heads, seq, d) or (batch, seq, d) inputs: the Gluon forward and backward, through the
    `cs336::flash_gluon_fwd` and `cs336::flash_gluon_bwd` operators under torch.compile and
    directly in eager mode (`launch.eager_on_plain_tensors`)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                schedule: str | None = None) -> Tensor:
        # The kernels read contiguous rows. A model's heads are views of token-major q, k, v:
        # copied here, before the operator, they are copied once a step rather than again in
        # the backward (which reads the saved copies), and under torch.compile Inductor can
        # write them so in the kernel that makes them (the rotary embedding's).
        q, k, v = _rows(q, k, v)
        if eager_on_plain_tensors(q):
            output = flash_gluon_forward(q, k, v, is_causal, schedule)
        else:
            output = torch.ops.cs336.flash_gluon_fwd(q, k, v, is_causal, schedule)
        _save(ctx, q, k, v, *output, is_causal)
        return output[0]

    @staticmethod
    def backward(ctx, grad_o: Tensor) -> tuple[Tensor | None, ...]:
        return *_gradients(ctx, grad_o), None, None
