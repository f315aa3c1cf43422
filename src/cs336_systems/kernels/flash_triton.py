"""FlashAttention-2 in Triton: forward kernel, two-pass backward (dK/dV, then dQ), no atomics.

Shapes: q (batch, n_queries, d), k and v (batch, n_keys, d), d a power of two.

Forward (FlashAttention-2, Algorithm 1): the grid is (query tiles, batch). Each program loads
one Q tile, walks the key tiles once, and keeps the running row max m, row sum l and output
accumulator in fp32 registers. P is cast to V's dtype before the P V product. It writes O and
the logsumexp L = m + log(l) (batch, n_queries), the only extra tensor saved for backward.

Backward (Algorithm 2, split to avoid atomics): with D = rowsum(dO * O),
  pass 1, grid (key tiles, batch):   dV_j = sum_i P_ij^T dO_i,  dK_j = sum_i dS_ij^T Q_i * scale
  pass 2, grid (query tiles, batch): dQ_i = sum_j dS_ij K_j * scale
where P_ij = exp(S_ij - L_i) and dS_ij = P_ij * (dO_i V_j^T - D_i). Each program owns the rows
it writes, so no two programs touch the same output.

Scores are kept in base 2 (exp2 is the hardware's instruction): S2 = Q K^T * scale * log2(e).
Causal masking adds -1e6 to scores of keys after the query. Pointer arithmetic only (no
`tl.make_block_ptr`, which Triton 3.9 removed), with explicit bounds masks.

fp32 inputs multiply in full fp32 ("ieee") unless `torch.backends.cuda.matmul.allow_tf32` is
set, the same switch that lets PyTorch's own fp32 matmuls use TF32.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from cs336_systems.kernels.checks import check_attention_inputs, require_triton_device
from cs336_systems.kernels.flash_pytorch import compiled_flash_backward

LOG2_E = tl.constexpr(1.4426950408889634)
LN_2 = tl.constexpr(0.6931471805599453)
CAUSAL_MASK_VALUE = tl.constexpr(-1e6)  # added to the scores of keys after the query


@triton.jit
def _load_tile(base_ptr, rows, n_rows, stride_row, cols, stride_col):
    """A (len(rows), len(cols)) tile; rows past n_rows read as zero."""
    mask = (rows < n_rows)[:, None]
    return tl.load(base_ptr + rows[:, None] * stride_row + cols[None, :] * stride_col,
                   mask=mask, other=0.0)


@triton.jit
def flash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qs, stride_qd,
    stride_kb, stride_ks, stride_kd,
    stride_vb, stride_vs, stride_vd,
    stride_ob, stride_os, stride_od,
    stride_lb, stride_ls,
    N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # program (query_tile, batch) owns rows [query_tile * Q_TILE, +Q_TILE) of one sequence
    query_tile = tl.program_id(0)
    batch = tl.program_id(1)
    q_rows = query_tile * Q_TILE + tl.arange(0, Q_TILE)
    cols = tl.arange(0, D)
    q = _load_tile(q_ptr + batch * stride_qb, q_rows, N_QUERIES, stride_qs, cols, stride_qd)

    row_max = tl.full((Q_TILE,), float("-inf"), dtype=tl.float32)       # m, base 2
    row_sum = tl.zeros((Q_TILE,), dtype=tl.float32)                     # l
    acc = tl.zeros((Q_TILE, D), dtype=tl.float32)                       # O before 1/l
    qk_scale = SCALE * LOG2_E                                           # scale * log2(e)

    # Alg. 1, line 6: one loop over key tiles; causal programs stop after their diagonal.
    k_end = N_KEYS
    if IS_CAUSAL:
        k_end = tl.minimum((query_tile + 1) * Q_TILE, N_KEYS)
    for k_start in range(0, k_end, K_TILE):
        k_rows = k_start + tl.arange(0, K_TILE)
        k = _load_tile(k_ptr + batch * stride_kb, k_rows, N_KEYS, stride_ks, cols, stride_kd)
        v = _load_tile(v_ptr + batch * stride_vb, k_rows, N_KEYS, stride_vs, cols, stride_vd)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # line 8
        scores = tl.where((k_rows < N_KEYS)[None, :], scores, float("-inf"))
        if IS_CAUSAL:
            scores += tl.where(q_rows[:, None] >= k_rows[None, :], 0.0, CAUSAL_MASK_VALUE)
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))           # line 9
        p = tl.exp2(scores - new_max[:, None])
        correction = tl.exp2(row_max - new_max)
        row_sum = correction * row_sum + tl.sum(p, axis=1)
        acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v,      # line 10
                                                 input_precision=DOT_PRECISION)
        row_max = new_max

    o = acc / row_sum[:, None]                                          # line 12
    logsumexp = (row_max + tl.log2(row_sum)) * LN_2                     # line 13, natural log
    row_mask = q_rows < N_QUERIES
    tl.store(o_ptr + batch * stride_ob + q_rows[:, None] * stride_os + cols[None, :] * stride_od,
             o.to(o_ptr.dtype.element_ty), mask=row_mask[:, None])
    tl.store(lse_ptr + batch * stride_lb + q_rows * stride_ls, logsumexp, mask=row_mask)


@triton.jit
def flash_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_b, stride_s, stride_d, stride_kb, stride_ks, stride_kd, stride_lb, stride_ls,
    N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Pass 1: program (key_tile, batch) accumulates dK and dV for its K_TILE keys."""
    key_tile = tl.program_id(0)
    batch = tl.program_id(1)
    k_rows = key_tile * K_TILE + tl.arange(0, K_TILE)
    cols = tl.arange(0, D)
    k = _load_tile(k_ptr + batch * stride_kb, k_rows, N_KEYS, stride_ks, cols, stride_kd)
    v = _load_tile(v_ptr + batch * stride_kb, k_rows, N_KEYS, stride_ks, cols, stride_kd)
    grad_k = tl.zeros((K_TILE, D), dtype=tl.float32)
    grad_v = tl.zeros((K_TILE, D), dtype=tl.float32)
    qk_scale = SCALE * LOG2_E

    # queries before this key tile cannot see it under a causal mask
    q_begin = 0
    if IS_CAUSAL:
        q_begin = (key_tile * K_TILE // Q_TILE) * Q_TILE
    for q_start in range(q_begin, N_QUERIES, Q_TILE):
        q_rows = q_start + tl.arange(0, Q_TILE)
        q_valid = q_rows < N_QUERIES
        q = _load_tile(q_ptr + batch * stride_b, q_rows, N_QUERIES, stride_s, cols, stride_d)
        grad_o = _load_tile(do_ptr + batch * stride_b, q_rows, N_QUERIES, stride_s, cols, stride_d)
        lse = tl.load(lse_ptr + batch * stride_lb + q_rows * stride_ls, mask=q_valid, other=0.0)
        delta = tl.load(delta_ptr + batch * stride_lb + q_rows * stride_ls, mask=q_valid, other=0.0)

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (Q, K)
        if IS_CAUSAL:
            scores += tl.where(q_rows[:, None] >= k_rows[None, :], 0.0, CAUSAL_MASK_VALUE)
        p = tl.exp2(scores - lse[:, None] * LOG2_E)        # P = exp(S - L)
        p = tl.where(q_valid[:, None] & (k_rows < N_KEYS)[None, :], p, 0.0)
        grad_v += tl.dot(tl.trans(p.to(grad_o.dtype)), grad_o, input_precision=DOT_PRECISION)
        grad_p = tl.dot(grad_o, tl.trans(v), input_precision=DOT_PRECISION)
        grad_s = p * (grad_p - delta[:, None])
        grad_k += tl.dot(tl.trans(grad_s.to(q.dtype)), q, input_precision=DOT_PRECISION)

    k_mask = (k_rows < N_KEYS)[:, None]
    offsets = batch * stride_kb + k_rows[:, None] * stride_ks + cols[None, :] * stride_kd
    tl.store(dk_ptr + offsets, (grad_k * SCALE).to(dk_ptr.dtype.element_ty), mask=k_mask)
    tl.store(dv_ptr + offsets, grad_v.to(dv_ptr.dtype.element_ty), mask=k_mask)


@triton.jit
def flash_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_b, stride_s, stride_d, stride_kb, stride_ks, stride_kd, stride_lb, stride_ls,
    N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Pass 2: program (query_tile, batch) accumulates dQ for its Q_TILE queries."""
    query_tile = tl.program_id(0)
    batch = tl.program_id(1)
    q_rows = query_tile * Q_TILE + tl.arange(0, Q_TILE)
    q_valid = q_rows < N_QUERIES
    cols = tl.arange(0, D)
    q = _load_tile(q_ptr + batch * stride_b, q_rows, N_QUERIES, stride_s, cols, stride_d)
    grad_o = _load_tile(do_ptr + batch * stride_b, q_rows, N_QUERIES, stride_s, cols, stride_d)
    lse = tl.load(lse_ptr + batch * stride_lb + q_rows * stride_ls, mask=q_valid, other=0.0)
    delta = tl.load(delta_ptr + batch * stride_lb + q_rows * stride_ls, mask=q_valid, other=0.0)
    grad_q = tl.zeros((Q_TILE, D), dtype=tl.float32)
    qk_scale = SCALE * LOG2_E

    k_end = N_KEYS
    if IS_CAUSAL:
        k_end = tl.minimum((query_tile + 1) * Q_TILE, N_KEYS)
    for k_start in range(0, k_end, K_TILE):
        k_rows = k_start + tl.arange(0, K_TILE)
        k = _load_tile(k_ptr + batch * stride_kb, k_rows, N_KEYS, stride_ks, cols, stride_kd)
        v = _load_tile(v_ptr + batch * stride_kb, k_rows, N_KEYS, stride_ks, cols, stride_kd)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if IS_CAUSAL:
            scores += tl.where(q_rows[:, None] >= k_rows[None, :], 0.0, CAUSAL_MASK_VALUE)
        p = tl.exp2(scores - lse[:, None] * LOG2_E)
        p = tl.where((k_rows < N_KEYS)[None, :], p, 0.0)
        grad_p = tl.dot(grad_o, tl.trans(v), input_precision=DOT_PRECISION)
        grad_s = p * (grad_p - delta[:, None])
        grad_q += tl.dot(grad_s.to(k.dtype), k, input_precision=DOT_PRECISION)

    tl.store(dq_ptr + batch * stride_b + q_rows[:, None] * stride_s + cols[None, :] * stride_d,
             (grad_q * SCALE).to(dq_ptr.dtype.element_ty), mask=q_valid[:, None])


def _dot_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"  # ignored for bf16/fp16 operands


def _forward_tiles(n_queries: int, n_keys: int, d: int, dtype: torch.dtype
                   ) -> tuple[int, int, int]:
    """(Q_TILE, K_TILE, num_warps) for the forward kernel."""
    if dtype == torch.float32:  # full-fp32 dots run on the FMA units: small tiles, no spills
        q_tile, k_tile = 32, 32
    else:
        q_tile, k_tile = (128 if d <= 64 else 64), 64
    q_tile, k_tile = min(q_tile, n_queries), min(k_tile, n_keys)
    return q_tile, k_tile, 4 if q_tile <= 64 else 8


def _backward_tiles(n_queries: int, n_keys: int, d: int, dtype: torch.dtype
                    ) -> tuple[int, int, int]:
    tile = 32 if dtype == torch.float32 or d > 64 else 64
    return min(tile, n_queries), min(tile, n_keys), 4


def triton_flash_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool
                         ) -> tuple[Tensor, Tensor]:
    batch, n_queries, d = q.shape
    n_keys = k.shape[1]
    o = torch.empty_like(q)
    logsumexp = torch.empty(batch, n_queries, device=q.device, dtype=torch.float32)
    q_tile, k_tile, num_warps = _forward_tiles(n_queries, n_keys, d, q.dtype)
    grid = (triton.cdiv(n_queries, q_tile), batch)
    flash_fwd_kernel[grid](
        q, k, v, o, logsumexp,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *logsumexp.stride(),
        n_queries, n_keys,
        SCALE=1.0 / math.sqrt(d), D=d, Q_TILE=q_tile, K_TILE=k_tile, IS_CAUSAL=is_causal,
        DOT_PRECISION=_dot_precision(q.dtype), num_warps=num_warps, num_stages=2,
    )
    return o, logsumexp


def triton_flash_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, logsumexp: Tensor,
                          grad_o: Tensor, is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    batch, n_queries, d = q.shape
    n_keys = k.shape[1]
    grad_o = grad_o.contiguous()
    delta = (grad_o.float() * o.float()).sum(dim=-1)                    # D = rowsum(dO * O)
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    q_tile, k_tile, num_warps = _backward_tiles(n_queries, n_keys, d, q.dtype)
    common = dict(SCALE=1.0 / math.sqrt(d), D=d, Q_TILE=q_tile, K_TILE=k_tile, IS_CAUSAL=is_causal,
                  DOT_PRECISION=_dot_precision(q.dtype), num_warps=num_warps, num_stages=2)
    # q, o and grad_o share one layout (contiguous), as do k and v.
    strides = (*q.stride(), *k.stride(), *logsumexp.stride())
    flash_bwd_dkdv_kernel[(triton.cdiv(n_keys, k_tile), batch)](
        q, k, v, grad_o, logsumexp, delta, grad_k, grad_v, *strides,
        n_queries, n_keys, **common)
    flash_bwd_dq_kernel[(triton.cdiv(n_queries, q_tile), batch)](
        q, k, v, grad_o, logsumexp, delta, grad_q, *strides,
        n_queries, n_keys, **common)
    return grad_q, grad_k, grad_v


class FlashAttentionTriton(torch.autograd.Function):
    """`FlashAttentionTriton.apply(q, k, v, is_causal=False)` -> o: Triton forward and backward."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        check_attention_inputs(q, k, v)
        require_triton_device(q, k, v)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o, logsumexp = triton_flash_forward(q, k, v, is_causal)
        ctx.save_for_backward(logsumexp, q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, grad_o: Tensor):
        logsumexp, q, k, v, o = ctx.saved_tensors
        grads = triton_flash_backward(q, k, v, o, logsumexp, grad_o, ctx.is_causal)
        return *grads, None


class FlashAttentionTritonTorchBackward(FlashAttentionTriton):
    """The Triton forward with the compiled-PyTorch backward, for comparison."""

    @staticmethod
    def backward(ctx, grad_o: Tensor):
        logsumexp, q, k, v, o = ctx.saved_tensors
        grads = compiled_flash_backward(q, k, v, o, logsumexp, grad_o, ctx.is_causal)
        return *grads, None
