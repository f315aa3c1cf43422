"""Cross-entropy's loss and gradient over one chunk of logits in one Triton kernel, in place:
`softmax_cross_entropy_`, the elementwise part of `lm.loss.linear_cross_entropy`.

For each row x (one token's logits over the vocabulary) with target t, scaled by s:

    lse  = log(sum_j exp(x_j))                 (pass 1: running max and sum, one read of x)
    loss = lse - x_t
    x_j <- s * (exp(x_j - lse) - [j == t])     (pass 2: a second read of x, one write)

so a row costs two reads and one write of the logits in their own dtype (bf16 from an autocast
matmul: 6 bytes an element), where the same steps as separate PyTorch ops (cast up, logsumexp,
subtract, exp, index, divide, cast down) read and write fp32 copies of the whole chunk about
ten times. Sums and exponentials are fp32, whatever the logits' dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cs336_systems.kernels.checks import require_triton_device

BLOCK = 4096  # logits a program reads at once, 16 per thread with 8 warps
WARPS = 8


@triton.jit
def _row_block(row_ptr, cols, n_cols, MASKED: tl.constexpr):
    """fp32 logits `cols` of one row; past `n_cols` (only in a masked block) -inf."""
    if MASKED:
        return tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    return tl.load(row_ptr + cols).to(tl.float32)


@triton.jit
def _running_sum(row_ptr, cols, n_cols, row_max, row_sum, MASKED: tl.constexpr):
    """Pass 1's step: fold one block into the running max and the sum of exp(x - max)."""
    x = _row_block(row_ptr, cols, n_cols, MASKED)
    new_max = tl.maximum(row_max, tl.max(x, axis=0))
    row_sum = row_sum * tl.exp(row_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
    return new_max, row_sum


@triton.jit
def _write_grad(row_ptr, cols, n_cols, lse, target, scale, MASKED: tl.constexpr):
    """Pass 2's step: one block of logits becomes its gradient, in the logits' dtype."""
    x = _row_block(row_ptr, cols, n_cols, MASKED)
    grad = tl.exp(x - lse)
    grad = tl.where(cols == target, grad - 1.0, grad) * scale
    mask = cols < n_cols if MASKED else None
    tl.store(row_ptr + cols, grad.to(row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_cross_entropy_row(logits_ptr, targets_ptr, losses_ptr, stride_row, n_cols, scale,
                               BLOCK: tl.constexpr):
    """One row of the chunk (program = row): its loss to `losses_ptr`, its gradient in place.
    Blocks are masked only at the row's end, when the vocabulary is no multiple of BLOCK."""
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    target = tl.load(targets_ptr + row)
    full_end = n_cols // BLOCK * BLOCK
    row_max = float("-inf")
    row_sum = 0.0
    for start in range(0, full_end, BLOCK):                                   # pass 1
        row_max, row_sum = _running_sum(row_ptr, start + tl.arange(0, BLOCK), n_cols,
                                        row_max, row_sum, MASKED=False)
    if full_end < n_cols:
        row_max, row_sum = _running_sum(row_ptr, full_end + tl.arange(0, BLOCK), n_cols,
                                        row_max, row_sum, MASKED=True)
    lse = row_max + tl.log(row_sum)
    tl.store(losses_ptr + row, lse - tl.load(row_ptr + target).to(tl.float32))
    for start in range(0, full_end, BLOCK):                                   # pass 2
        _write_grad(row_ptr, start + tl.arange(0, BLOCK), n_cols, lse, target, scale,
                    MASKED=False)
    if full_end < n_cols:
        _write_grad(row_ptr, full_end + tl.arange(0, BLOCK), n_cols, lse, target, scale,
                    MASKED=True)


def softmax_cross_entropy_(logits: torch.Tensor, targets: torch.Tensor, scale: float,
                           block: int = BLOCK, num_warps: int = WARPS) -> torch.Tensor:
    """Each row's cross-entropy loss (fp32, (rows,)); `logits` (rows, vocab) becomes, in place,
    `scale` x the loss's gradient with respect to it (softmax minus the one-hot target)."""
    require_triton_device(logits, targets)
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits (rows, vocab) and targets (rows,) must agree; got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if logits.stride(1) != 1:
        raise ValueError(f"logits' rows must be contiguous; got strides {logits.stride()}")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"logits must be float32, bfloat16 or float16; got {logits.dtype}")
    losses = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    if logits.shape[0]:
        _softmax_cross_entropy_row[(logits.shape[0],)](
            logits, targets, losses, logits.stride(0), logits.shape[1], scale,
            BLOCK=block, num_warps=num_warps)
    return losses
