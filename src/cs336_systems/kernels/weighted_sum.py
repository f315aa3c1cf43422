"""The Triton warm-up: out[i] = sum_j x[i, j] * w[j], forward and backward, as an autograd.Function.

x is (..., D) and w is (D,); leading dimensions are flattened into rows. Each program owns a
tile of ROWS_PER_TILE rows and walks the D columns in tiles of D_TILE.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from einops import rearrange

from cs336_systems.kernels.checks import require_triton_device


@triton.jit
def weighted_sum_fwd_kernel(x_ptr, w_ptr, out_ptr, n_rows, D, stride_x_row, stride_x_col,
                            ROWS_PER_TILE: tl.constexpr, D_TILE: tl.constexpr):
    row_tile = tl.program_id(0)
    rows = row_tile * ROWS_PER_TILE + tl.arange(0, ROWS_PER_TILE)
    row_mask = rows < n_rows
    acc = tl.zeros((ROWS_PER_TILE,), dtype=tl.float32)
    for col_start in range(0, D, D_TILE):
        cols = col_start + tl.arange(0, D_TILE)
        col_mask = cols < D
        x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :] * stride_x_col,
                    mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
        acc += tl.sum(x.to(tl.float32) * w.to(tl.float32)[None, :], axis=1)
    tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def weighted_sum_bwd_kernel(x_ptr, w_ptr, grad_out_ptr, grad_x_ptr, partial_grad_w_ptr,
                            n_rows, D, stride_x_row, stride_x_col,
                            ROWS_PER_TILE: tl.constexpr, D_TILE: tl.constexpr):
    """grad_x = grad_out[:, None] * w[None, :]; this row tile's share of grad_w = x^T grad_out."""
    row_tile = tl.program_id(0)
    rows = row_tile * ROWS_PER_TILE + tl.arange(0, ROWS_PER_TILE)
    row_mask = rows < n_rows
    grad_out = tl.load(grad_out_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    for col_start in range(0, D, D_TILE):
        cols = col_start + tl.arange(0, D_TILE)
        col_mask = cols < D
        tile_mask = row_mask[:, None] & col_mask[None, :]
        offsets = rows[:, None] * stride_x_row + cols[None, :] * stride_x_col
        x = tl.load(x_ptr + offsets, mask=tile_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        grad_x = grad_out[:, None] * w[None, :]
        # grad_x is written contiguous (row-major, D columns)
        tl.store(grad_x_ptr + rows[:, None] * D + cols[None, :],
                 grad_x.to(grad_x_ptr.dtype.element_ty), mask=tile_mask)
        partial = tl.sum(x * grad_out[:, None], axis=0)  # (D_TILE,)
        tl.store(partial_grad_w_ptr + row_tile * D + cols, partial, mask=col_mask)


def _tiles(D: int) -> tuple[int, int]:
    rows_per_tile = 16
    d_tile = min(triton.next_power_of_2(D), 128)
    return rows_per_tile, d_tile


class WeightedSumFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        require_triton_device(x, weight)
        if weight.ndim != 1 or x.shape[-1] != weight.shape[0]:
            raise ValueError(f"weighted_sum needs x of shape (..., D) and weight of shape (D,); "
                             f"got {tuple(x.shape)} and {tuple(weight.shape)}")
        leading = x.shape[:-1]
        weight = weight.contiguous()  # the kernels index it with unit stride
        x2d = rearrange(x, "... d -> (...) d")
        n_rows, D = x2d.shape
        rows_per_tile, d_tile = _tiles(D)
        out = torch.empty(n_rows, device=x.device, dtype=x.dtype)
        weighted_sum_fwd_kernel[(triton.cdiv(n_rows, rows_per_tile),)](
            x2d, weight, out, n_rows, D, x2d.stride(0), x2d.stride(1),
            ROWS_PER_TILE=rows_per_tile, D_TILE=d_tile)
        ctx.save_for_backward(x2d, weight)
        ctx.leading = leading
        return out.view(leading)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x2d, weight = ctx.saved_tensors
        n_rows, D = x2d.shape
        rows_per_tile, d_tile = _tiles(D)
        n_row_tiles = triton.cdiv(n_rows, rows_per_tile)
        grad_out = grad_out.reshape(n_rows).contiguous()
        grad_x = torch.empty(n_rows, D, device=x2d.device, dtype=x2d.dtype)
        partial_grad_w = torch.empty(n_row_tiles, D, device=x2d.device, dtype=torch.float32)
        weighted_sum_bwd_kernel[(n_row_tiles,)](
            x2d, weight, grad_out, grad_x, partial_grad_w, n_rows, D,
            x2d.stride(0), x2d.stride(1), ROWS_PER_TILE=rows_per_tile, D_TILE=d_tile)
        grad_weight = partial_grad_w.sum(dim=0).to(weight.dtype)
        return grad_x.view(*ctx.leading, D), grad_weight


def weighted_sum(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return WeightedSumFn.apply(x, weight)
