"""Cross-entropy written out: mean over positions of logsumexp(logits) - logits[target]; and the
same loss of an LM head taken chunk by chunk, so that the logits never exist whole.

    loss = cross_entropy(model(ids), targets)                       # logits (batch, seq, vocab)
    loss = linear_cross_entropy(hidden, lm_head.weight, targets)    # (tokens, d) -> same loss

`HEAD_LOSSES` names these beside the stock ones users take for the LM head and its loss
(Liger Kernel's fused linear cross-entropy, Apple's Cut Cross-Entropy, optional packages), for
the leaderboard's loss benchmark.

At the 2026 leaderboard's shape (2 x 32768 tokens, vocab 151936) the fp32 logits alone are
40 GB, and their gradient as much again; `linear_cross_entropy` holds one chunk's, a chunk
about the size of the hidden states, or larger where dW accumulates in fp32 (`default_chunk`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# The kernel the chunked loss imports lazily on CUDA (Triton only when used): a rule whose job
# runs the chunked loss lists it among its sources.
KERNEL_MODULE = "cs336_systems.kernels.cross_entropy"


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    # logits: (..., vocab), targets: (...) int64; computed in fp32 for stability under autocast.
    logits = logits.float()
    target_logits = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (logits.logsumexp(dim=-1) - target_logits).mean()


# Where dW accumulates in fp32 (the training step's fp32 weights) and there are as many tokens,
# a chunk takes at least these: each chunk reads and writes the accumulator (vocab x d, 5 GB in
# fp32 at the 2026 leaderboard's shape), traffic that a small chunk's matmuls do not hide (one
# H200, 32768 tokens, d 4096, vocab 151936, fp32 weights, forward+backward in one process: 213
# ms at 1024 tokens a chunk, 195 to 200 at 2048, 190 to 193 at 4096, 191 at 8192).
MIN_FP32_CHUNK_TOKENS = 4096


def default_chunk(tokens: int, d_model: int, vocab: int, fp32_accumulator: bool = False) -> int:
    """Tokens per chunk: the power of two at or above tokens / ceil(vocab / d_model), so that a
    chunk's logits are about the size of the hidden states, as Liger's fused loss sizes its
    chunks (1024 of 32768 tokens at d 4096 and vocab 151936: 0.3 GiB of bf16 logits at a time);
    with an fp32 dW accumulator, no fewer than `MIN_FP32_CHUNK_TOKENS` where there are as many
    (4096 there: 1.2 GiB of logits, for a loss 10% faster)."""
    per_row = -(-vocab // d_model)
    size = 1 << max(0, (-(-tokens // per_row) - 1).bit_length())
    return max(size, min(MIN_FP32_CHUNK_TOKENS, tokens)) if fp32_accumulator else size


def _compute_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's where autocast is on, else hidden's."""
    kind = hidden.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype


def _accumulate(total: Tensor, a: Tensor, b: Tensor) -> None:
    """total += a @ b for fp32 `total`: one matmul accumulating into it where the inputs are
    fp32 or the device has a mixed-precision one (CUDA's bf16 x bf16 -> fp32), else the product
    cast up and added."""
    if a.dtype == total.dtype:
        total.addmm_(a, b)
    elif total.is_cuda:
        torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
    else:
        total += (a @ b).float()


def _softmax_cross_entropy_torch(logits: Tensor, targets: Tensor, scale: float
                                 ) -> tuple[Tensor, Tensor]:
    """Each row's loss, and scale x its gradient (softmax minus the one-hot target), both in
    fp32: the readable definition of `kernels.cross_entropy.softmax_cross_entropy_`."""
    logits = logits.float()
    lse = logits.logsumexp(dim=-1)
    losses = lse - logits.gather(-1, targets[:, None]).squeeze(-1)
    grad = logits.sub_(lse[:, None]).exp_()                           # softmax, in place
    grad[torch.arange(len(targets), device=targets.device), targets] -= 1.0
    return losses, grad.mul_(scale)


class _LinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(hidden_i W^T, target_i), chunk by chunk of tokens. The gradients are taken in
    the forward, while a chunk's logits exist (softmax minus the one-hot target, over the token
    count), as Liger-Kernel's fused linear cross-entropy does; the backward only scales them by
    the incoming gradient, in place. Matmuls run in the autocast dtype, softmax and sums in
    fp32, and dW accumulates in the weight's dtype: in fp32 for the training step's fp32
    weights; for a 16-bit weight in its dtype, rounded once a chunk, so that the loss holds no
    more than the gradients it returns and one chunk's logits. With `kernel`, a chunk's loss
    and gradient are one Triton pass over its logits, in place (`softmax_cross_entropy_`);
    else PyTorch ops in fp32."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int,
                kernel: bool) -> Tensor:
        dtype = _compute_dtype(hidden)
        tokens = hidden.shape[0]
        if kernel:
            from cs336_systems.kernels.cross_entropy import softmax_cross_entropy_
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)                                      # (vocab, d)
            grad_hidden = torch.empty(hidden.shape, dtype=dtype, device=hidden.device)
            grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            # one chunk's logits, reused: a fresh tensor each chunk would live beside the last
            buffer = torch.empty((min(chunk, tokens), w.shape[0]), dtype=dtype, device=w.device)
            for start in range(0, tokens, chunk):
                h = hidden[start:start + chunk].to(dtype)             # (c, d)
                t = targets[start:start + chunk]
                logits = torch.mm(h, w.T, out=buffer[:len(h)])        # (c, vocab)
                if kernel:
                    losses, grad = softmax_cross_entropy_(logits, t, 1.0 / tokens), logits
                else:
                    losses, grad = _softmax_cross_entropy_torch(logits, t, 1.0 / tokens)
                    grad = grad.to(dtype)                             # dLoss/dlogits
                total += losses.sum()
                torch.mm(grad, w, out=grad_hidden[start:start + chunk])
                if grad_weight is not None:
                    _accumulate(grad_weight, grad.T, h)
        ctx.save_for_backward(grad_hidden, *([grad_weight] if grad_weight is not None else []))
        ctx.hidden_dtype, ctx.used = hidden.dtype, False
        return total / tokens

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        if ctx.used:
            raise RuntimeError("linear_cross_entropy's backward runs once: it scales the "
                               "gradients it saved in place")
        ctx.used = True
        grad_hidden, *grad_weight = ctx.saved_tensors
        dh = grad_hidden.mul_(grad_loss).to(ctx.hidden_dtype) if ctx.needs_input_grad[0] else None
        dw = grad_weight[0].mul_(grad_loss) if grad_weight else None
        return dh, dw, None, None, None


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor,
                         chunk: int | None = None, kernel: bool | None = None) -> Tensor:
    """cross_entropy(hidden @ weight^T, targets) without the whole logits: hidden (..., d),
    weight (vocab, d) as `Linear` holds it, targets (...) int64 in [0, vocab); `chunk` tokens
    at a time (default: `default_chunk`). `kernel`: a chunk's softmax and gradient in one
    Triton pass (default: on CUDA), else in PyTorch ops."""
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be at least 1 token; got {chunk}")
    if hidden.shape[:-1] != targets.shape or hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"hidden (..., d), weight (vocab, d) and targets (...) must agree; got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}")
    if chunk is None:
        chunk = default_chunk(targets.numel(), weight.shape[1], weight.shape[0],
                              fp32_accumulator=weight.dtype == torch.float32)
    if kernel is None:
        kernel = hidden.is_cuda
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight,
                                     targets.reshape(-1), chunk, kernel)


# --- the LM head and its loss, as users take it: a registry ---------------------------------

def whole_logits_loss(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """The model as written: the whole (tokens, vocab) logits, then the loss in fp32."""
    return cross_entropy(hidden @ weight.T, targets)


def liger_loss(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Liger Kernel's fused linear cross-entropy (optional package `liger-kernel`)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    return liger_fused_linear_cross_entropy(hidden, weight, targets)


def cut_cross_entropy_loss(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Apple's Cut Cross-Entropy (optional package `cut-cross-entropy`), its Triton kernels."""
    from cut_cross_entropy import linear_cross_entropy as cce
    return cce(hidden, weight, targets)


@dataclass(frozen=True)
class HeadLoss:
    """One way to take (hidden (tokens, d), the head's weight (vocab, d), targets) -> the mean
    loss: the callable, its label in tables, and the optional package it needs (import name,
    pip name) with its Triton kernels, which run on CUDA only."""

    fn: Callable[[Tensor, Tensor, Tensor], Tensor]
    label: str
    package: tuple[str, str] | None = None


HEAD_LOSSES: dict[str, HeadLoss] = {
    "whole-logits": HeadLoss(whole_logits_loss, "whole logits (as written)"),
    "chunked": HeadLoss(linear_cross_entropy, "ours, chunked"),
    "liger": HeadLoss(liger_loss, "Liger fused linear CE", ("liger_kernel", "liger-kernel")),
    "cut-cross-entropy": HeadLoss(cut_cross_entropy_loss, "Cut Cross-Entropy",
                                  ("cut_cross_entropy", "cut-cross-entropy")),
}


def head_loss_unavailable_reason(name: str, device: torch.device) -> str | None:
    """Why loss `name` cannot run on `device` here (its package missing, a CPU), or None."""
    if name not in HEAD_LOSSES:
        raise ValueError(f"unknown LM-head loss {name!r}; allowed: {', '.join(HEAD_LOSSES)}")
    loss = HEAD_LOSSES[name]
    if loss.package is None:
        return None
    module, pip_name = loss.package
    if importlib.util.find_spec(module) is None:
        return f"{loss.label} is not installed (pip install {pip_name})"
    if device.type != "cuda":
        return f"{loss.label} runs Triton kernels on CUDA only"
    return None
