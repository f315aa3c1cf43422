"""FlashAttention-2 in Triton: forward kernel, two-pass backward (dK/dV, then dQ), no atomics.

Shapes: q (batch, n_queries, d), k and v (batch, n_keys, d), any n_queries, n_keys >= 1 and
1 <= d <= 256 (`checks.check_attention_inputs`). The causal mask is SDPA's `is_causal=True`:
query i sees keys 0..i (`torch.ones(n_queries, n_keys).tril()`, aligned at the top left), so
every query sees at least key 0 and no row of the softmax is empty.

Tiles: a query tile is BLOCK_M rows of q, a key tile BLOCK_N rows of k and v, each BLOCK_D
columns wide, BLOCK_D being d rounded up to a power of two (tl.arange and tl.dot need powers of
two of at least 16). The last tile of an axis overhangs the tensor unless the axis divides
evenly: EVEN_M (n_queries % BLOCK_M == 0), EVEN_N (n_keys % BLOCK_N == 0) and EVEN_D
(d == BLOCK_D) are compile-time flags, and only tiles that can overhang load, store and score
with masks; overhanging rows and columns read as zero. Under the causal mask the key tiles of
a query tile fall in three kinds: before its first query (seen whole, unmasked), the band
[first query, first query + BLOCK_M) that the diagonal cuts (masked), and after the band
(never seen, skipped). So power-of-two shapes run every tile off the band without a mask,
as in Triton's fused-attention tutorial.

Forward (FlashAttention-2, Algorithm 1): the grid is (query tiles, batch). Each program loads
one query tile, walks its key tiles once, and keeps the running row max m, row sum l and output
accumulator in fp32 registers. P is cast to V's dtype before the P V product. It writes O and
the logsumexp L = m + log(l) (batch, n_queries), the only extra tensor saved for backward.

Backward (Algorithm 2, split to avoid atomics): with D = rowsum(dO * O),
  pass 1, grid (key tiles, batch):   dV_j = sum_i P_ij^T dO_i,  dK_j = sum_i dS_ij^T Q_i * scale
  pass 2, grid (query tiles, batch): dQ_i = sum_j dS_ij K_j * scale
where P_ij = exp(S_ij - L_i) and dS_ij = P_ij * (dO_i V_j^T - D_i). Each program owns the rows
it writes, so no two programs touch the same output.

Scores are kept in base 2 (exp2 is the hardware's instruction): S2 = Q K^T * scale * log2(e).
Causal masking adds -1e6 to scores of keys after the query. Pointer arithmetic only (no
`tl.make_block_ptr`, which Triton 3.9 removed).

The kernels run inside two custom operators, `cs336::flash_attn_fwd` (q, k, v, is_causal ->
o, L) and `cs336::flash_attn_bwd` (q, k, v, o, L, dO, is_causal -> dQ, dK, dV), made with
`torch.library.triton_op`: torch.compile sees them as operators with fake (shape-only)
implementations instead of tracing Python kernel launches, and Inductor can still reach the
kernels. The forward operator is differentiable through the backward one. `FlashAttentionTriton`
is the assignment's autograd.Function over the same operators.

fp32 inputs multiply in full fp32 ("ieee") unless `torch.backends.cuda.matmul.allow_tf32` is
set, the same switch that lets PyTorch's own fp32 matmuls use TF32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

from cs336_systems.kernels.checks import (
    MAX_HEAD_DIM,
    check_attention_inputs,
    require_triton_device,
)
from cs336_systems.kernels.flash_pytorch import compiled_flash_backward

LOG2_E = tl.constexpr(1.4426950408889634)
LN_2 = tl.constexpr(0.6931471805599453)
CAUSAL_MASK_VALUE = tl.constexpr(-1e6)  # added to the scores of keys after the query


# --- tile helpers: masks only where a flag says the tile can overhang -------------------------

@triton.jit
def _load_tile(base_ptr, rows, stride_row, cols, stride_col, n_rows, n_cols,
               EVEN_ROWS: tl.constexpr, EVEN_COLS: tl.constexpr):
    """The (len(rows), len(cols)) tile at base_ptr; entries past n_rows or n_cols read as 0."""
    ptrs = base_ptr + rows[:, None] * stride_row + cols[None, :] * stride_col
    if EVEN_ROWS:
        if EVEN_COLS:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=(cols < n_cols)[None, :], other=0.0)
    else:
        if EVEN_COLS:
            tile = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
        else:
            tile = tl.load(ptrs, mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :],
                           other=0.0)
    return tile


@triton.jit
def _store_tile(base_ptr, rows, stride_row, cols, stride_col, n_rows, n_cols, tile,
                EVEN_ROWS: tl.constexpr, EVEN_COLS: tl.constexpr):
    """Stores the entries of `tile` that lie inside (n_rows, n_cols)."""
    ptrs = base_ptr + rows[:, None] * stride_row + cols[None, :] * stride_col
    tile = tile.to(base_ptr.dtype.element_ty)
    if EVEN_ROWS:
        if EVEN_COLS:
            tl.store(ptrs, tile)
        else:
            tl.store(ptrs, tile, mask=(cols < n_cols)[None, :])
    else:
        if EVEN_COLS:
            tl.store(ptrs, tile, mask=(rows < n_rows)[:, None])
        else:
            tl.store(ptrs, tile, mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :])


@triton.jit
def _load_rows(base_ptr, rows, stride, n_rows, EVEN_ROWS: tl.constexpr):
    """One value per row (L or D); rows past n_rows read as 0."""
    if EVEN_ROWS:
        values = tl.load(base_ptr + rows * stride)
    else:
        values = tl.load(base_ptr + rows * stride, mask=rows < n_rows, other=0.0)
    return values


@triton.jit
def _key_ranges(q_start, N_KEYS, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
                EVEN_N: tl.constexpr):
    """(whole_end, seen_end) for the query tile starting at q_start: key tiles starting before
    whole_end need no mask; one more, up to seen_end, overhangs N_KEYS. Under the causal mask
    both stop at the band, which the caller walks separately."""
    seen_end = N_KEYS
    if IS_CAUSAL:
        seen_end = tl.minimum(q_start, N_KEYS)
    whole_end = seen_end
    if not EVEN_N:
        whole_end = tl.minimum(seen_end, N_KEYS // BLOCK_N * BLOCK_N)
    return whole_end, seen_end


@triton.jit
def _causal_scores(scores, q_rows, k_rows):
    """Adds CAUSAL_MASK_VALUE to the scores of keys after their query."""
    return scores + tl.where(q_rows[:, None] >= k_rows[None, :], 0.0, CAUSAL_MASK_VALUE)


# --- forward ---------------------------------------------------------------------------------

@triton.jit
def _fwd_key_tiles(acc, row_max, row_sum, q, q_rows, k_base, v_base,
                   stride_ks, stride_kd, stride_vs, stride_vd, cols, k_lo, k_hi, N_KEYS, qk_scale,
                   D: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
                   EVEN_D: tl.constexpr, BAND: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Alg. 1, lines 7-10, over the key tiles starting in [k_lo, k_hi)."""
    for k_start in range(k_lo, k_hi, BLOCK_N):
        k_rows = k_start + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, k_rows, stride_ks, cols, stride_kd, N_KEYS, D, EVEN_N, EVEN_D)
        v = _load_tile(v_base, k_rows, stride_vs, cols, stride_vd, N_KEYS, D, EVEN_N, EVEN_D)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # line 8
        if not EVEN_N:
            scores = tl.where((k_rows < N_KEYS)[None, :], scores, float("-inf"))
        if BAND:
            scores = _causal_scores(scores, q_rows, k_rows)
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))           # line 9
        p = tl.exp2(scores - new_max[:, None])
        correction = tl.exp2(row_max - new_max)
        row_sum = correction * row_sum + tl.sum(p, axis=1)
        acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v,      # line 10
                                                 input_precision=DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def flash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qs, stride_qd,
    stride_kb, stride_ks, stride_kd,
    stride_vb, stride_vs, stride_vd,
    stride_ob, stride_os, stride_od,
    stride_lb, stride_ls,
    N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # program (query_tile, batch) owns query rows [q_start, q_start + BLOCK_M) of one sequence
    query_tile = tl.program_id(0)
    batch = tl.program_id(1)
    q_start = query_tile * BLOCK_M
    q_rows = q_start + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    q = _load_tile(q_ptr + batch * stride_qb, q_rows, stride_qs, cols, stride_qd,
                   N_QUERIES, D, EVEN_M, EVEN_D)
    k_base = k_ptr + batch * stride_kb
    v_base = v_ptr + batch * stride_vb

    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)     # m, base 2
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)                   # l
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)               # O before 1/l
    qk_scale = SCALE * LOG2_E                                          # scale * log2(e)

    # Alg. 1, line 6: the key tiles, whole ones first, then the overhanging one, then the band.
    whole_end, seen_end = _key_ranges(q_start, N_KEYS, BLOCK_N, IS_CAUSAL, EVEN_N)
    acc, row_max, row_sum = _fwd_key_tiles(
        acc, row_max, row_sum, q, q_rows, k_base, v_base, stride_ks, stride_kd, stride_vs,
        stride_vd, cols, 0, whole_end, N_KEYS, qk_scale, D, BLOCK_N, True, EVEN_D, False,
        DOT_PRECISION)
    if not EVEN_N:
        acc, row_max, row_sum = _fwd_key_tiles(
            acc, row_max, row_sum, q, q_rows, k_base, v_base, stride_ks, stride_kd, stride_vs,
            stride_vd, cols, whole_end, seen_end, N_KEYS, qk_scale, D, BLOCK_N, False, EVEN_D,
            False, DOT_PRECISION)
    if IS_CAUSAL:
        acc, row_max, row_sum = _fwd_key_tiles(
            acc, row_max, row_sum, q, q_rows, k_base, v_base, stride_ks, stride_kd, stride_vs,
            stride_vd, cols, q_start, tl.minimum(q_start + BLOCK_M, N_KEYS), N_KEYS, qk_scale,
            D, BLOCK_N, EVEN_N, EVEN_D, True, DOT_PRECISION)

    o = acc / row_sum[:, None]                                         # line 12
    logsumexp = (row_max + tl.log2(row_sum)) * LN_2                    # line 13, natural log
    _store_tile(o_ptr + batch * stride_ob, q_rows, stride_os, cols, stride_od, N_QUERIES, D, o,
                EVEN_M, EVEN_D)
    lse_ptrs = lse_ptr + batch * stride_lb + q_rows * stride_ls
    if EVEN_M:
        tl.store(lse_ptrs, logsumexp)
    else:
        tl.store(lse_ptrs, logsumexp, mask=q_rows < N_QUERIES)


# --- backward, pass 1: dK and dV -------------------------------------------------------------

@triton.jit
def _dkdv_query_tiles(grad_k, grad_v, k, v, k_rows, q_base, do_base, lse_base, delta_base,
                      stride_s, stride_d, stride_ls, cols, q_lo, q_hi, N_QUERIES, qk_scale,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_M: tl.constexpr,
                      EVEN_D: tl.constexpr, BAND: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Alg. 2 from one key tile's side, over the query tiles starting in [q_lo, q_hi).
    Overhanging query rows read q = dO = 0, so their P is finite and they add nothing."""
    for q_start in range(q_lo, q_hi, BLOCK_M):
        q_rows = q_start + tl.arange(0, BLOCK_M)
        q = _load_tile(q_base, q_rows, stride_s, cols, stride_d, N_QUERIES, D, EVEN_M, EVEN_D)
        grad_o = _load_tile(do_base, q_rows, stride_s, cols, stride_d, N_QUERIES, D, EVEN_M,
                            EVEN_D)
        lse = _load_rows(lse_base, q_rows, stride_ls, N_QUERIES, EVEN_M)
        delta = _load_rows(delta_base, q_rows, stride_ls, N_QUERIES, EVEN_M)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (M, N)
        if BAND:
            scores = _causal_scores(scores, q_rows, k_rows)
        p = tl.exp2(scores - lse[:, None] * LOG2_E)                    # P = exp(S - L)
        grad_v += tl.dot(tl.trans(p.to(grad_o.dtype)), grad_o, input_precision=DOT_PRECISION)
        grad_p = tl.dot(grad_o, tl.trans(v), input_precision=DOT_PRECISION)
        grad_s = p * (grad_p - delta[:, None])
        grad_k += tl.dot(tl.trans(grad_s.to(q.dtype)), q, input_precision=DOT_PRECISION)
    return grad_k, grad_v


@triton.jit
def flash_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_b, stride_s, stride_d, stride_kb, stride_ks, stride_kd, stride_lb, stride_ls,
    N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Pass 1: program (key_tile, batch) accumulates dK and dV for keys [k_start, +BLOCK_N).
    BLOCK_N is a multiple of BLOCK_M, so the band is whole query tiles."""
    key_tile = tl.program_id(0)
    batch = tl.program_id(1)
    k_start = key_tile * BLOCK_N
    k_rows = k_start + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    k = _load_tile(k_ptr + batch * stride_kb, k_rows, stride_ks, cols, stride_kd, N_KEYS, D,
                   EVEN_N, EVEN_D)
    v = _load_tile(v_ptr + batch * stride_kb, k_rows, stride_ks, cols, stride_kd, N_KEYS, D,
                   EVEN_N, EVEN_D)
    q_base = q_ptr + batch * stride_b
    do_base = do_ptr + batch * stride_b
    lse_base = lse_ptr + batch * stride_lb
    delta_base = delta_ptr + batch * stride_lb
    grad_k = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    grad_v = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    qk_scale = SCALE * LOG2_E

    # Queries before k_start cannot see this key tile under the causal mask, the band
    # [k_start, k_start + BLOCK_N) sees part of it, and every later query sees all of it.
    after_band = 0
    if IS_CAUSAL:
        after_band = k_start + BLOCK_N
    whole_end = N_QUERIES
    if not EVEN_M:
        whole_end = N_QUERIES // BLOCK_M * BLOCK_M
    grad_k, grad_v = _dkdv_query_tiles(
        grad_k, grad_v, k, v, k_rows, q_base, do_base, lse_base, delta_base, stride_s, stride_d,
        stride_ls, cols, after_band, whole_end, N_QUERIES, qk_scale, D, BLOCK_M, True, EVEN_D,
        False, DOT_PRECISION)
    if not EVEN_M:  # the query tile that overhangs N_QUERIES, when after the band
        grad_k, grad_v = _dkdv_query_tiles(
            grad_k, grad_v, k, v, k_rows, q_base, do_base, lse_base, delta_base, stride_s,
            stride_d, stride_ls, cols, tl.maximum(after_band, whole_end), N_QUERIES, N_QUERIES,
            qk_scale, D, BLOCK_M, False, EVEN_D, False, DOT_PRECISION)
    if IS_CAUSAL:
        grad_k, grad_v = _dkdv_query_tiles(
            grad_k, grad_v, k, v, k_rows, q_base, do_base, lse_base, delta_base, stride_s,
            stride_d, stride_ls, cols, k_start, tl.minimum(k_start + BLOCK_N, N_QUERIES),
            N_QUERIES, qk_scale, D, BLOCK_M, EVEN_M, EVEN_D, True, DOT_PRECISION)

    offsets = batch * stride_kb
    _store_tile(dk_ptr + offsets, k_rows, stride_ks, cols, stride_kd, N_KEYS, D, grad_k * SCALE,
                EVEN_N, EVEN_D)
    _store_tile(dv_ptr + offsets, k_rows, stride_ks, cols, stride_kd, N_KEYS, D, grad_v,
                EVEN_N, EVEN_D)


# --- backward, pass 2: dQ --------------------------------------------------------------------

@triton.jit
def _dq_key_tiles(grad_q, q, grad_o, lse, delta, q_rows, k_base, v_base, stride_ks, stride_kd,
                  cols, k_lo, k_hi, N_KEYS, qk_scale,
                  D: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
                  EVEN_D: tl.constexpr, BAND: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Alg. 2 from one query tile's side, over the key tiles starting in [k_lo, k_hi)."""
    for k_start in range(k_lo, k_hi, BLOCK_N):
        k_rows = k_start + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, k_rows, stride_ks, cols, stride_kd, N_KEYS, D, EVEN_N, EVEN_D)
        v = _load_tile(v_base, k_rows, stride_ks, cols, stride_kd, N_KEYS, D, EVEN_N, EVEN_D)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if BAND:
            scores = _causal_scores(scores, q_rows, k_rows)
        p = tl.exp2(scores - lse[:, None] * LOG2_E)
        if not EVEN_N:  # overhanging keys read k = 0, and exp(0 - L) may overflow
            p = tl.where((k_rows < N_KEYS)[None, :], p, 0.0)
        grad_p = tl.dot(grad_o, tl.trans(v), input_precision=DOT_PRECISION)
        grad_s = p * (grad_p - delta[:, None])
        grad_q += tl.dot(grad_s.to(k.dtype), k, input_precision=DOT_PRECISION)
    return grad_q


@triton.jit
def flash_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_b, stride_s, stride_d, stride_kb, stride_ks, stride_kd, stride_lb, stride_ls,
    N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Pass 2: program (query_tile, batch) accumulates dQ for queries [q_start, +BLOCK_M).
    BLOCK_M is a multiple of BLOCK_N, so the band is whole key tiles."""
    query_tile = tl.program_id(0)
    batch = tl.program_id(1)
    q_start = query_tile * BLOCK_M
    q_rows = q_start + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    q = _load_tile(q_ptr + batch * stride_b, q_rows, stride_s, cols, stride_d, N_QUERIES, D,
                   EVEN_M, EVEN_D)
    grad_o = _load_tile(do_ptr + batch * stride_b, q_rows, stride_s, cols, stride_d, N_QUERIES,
                        D, EVEN_M, EVEN_D)
    lse = _load_rows(lse_ptr + batch * stride_lb, q_rows, stride_ls, N_QUERIES, EVEN_M)
    delta = _load_rows(delta_ptr + batch * stride_lb, q_rows, stride_ls, N_QUERIES, EVEN_M)
    k_base = k_ptr + batch * stride_kb
    v_base = v_ptr + batch * stride_kb
    grad_q = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    qk_scale = SCALE * LOG2_E

    whole_end, seen_end = _key_ranges(q_start, N_KEYS, BLOCK_N, IS_CAUSAL, EVEN_N)
    grad_q = _dq_key_tiles(grad_q, q, grad_o, lse, delta, q_rows, k_base, v_base, stride_ks,
                           stride_kd, cols, 0, whole_end, N_KEYS, qk_scale, D, BLOCK_N, True,
                           EVEN_D, False, DOT_PRECISION)
    if not EVEN_N:
        grad_q = _dq_key_tiles(grad_q, q, grad_o, lse, delta, q_rows, k_base, v_base, stride_ks,
                               stride_kd, cols, whole_end, seen_end, N_KEYS, qk_scale, D,
                               BLOCK_N, False, EVEN_D, False, DOT_PRECISION)
    if IS_CAUSAL:
        grad_q = _dq_key_tiles(grad_q, q, grad_o, lse, delta, q_rows, k_base, v_base, stride_ks,
                               stride_kd, cols, q_start, tl.minimum(q_start + BLOCK_M, N_KEYS),
                               N_KEYS, qk_scale, D, BLOCK_N, EVEN_N, EVEN_D, True, DOT_PRECISION)

    _store_tile(dq_ptr + batch * stride_b, q_rows, stride_s, cols, stride_d, N_QUERIES, D,
                grad_q * SCALE, EVEN_M, EVEN_D)


# --- launch configuration ------------------------------------------------------------------

def _tile(n, largest: int) -> int:
    """The least power of two >= n, at least 16 (tl.dot's least tile) and at most `largest`.
    Only comparisons, so a symbolic n under torch.compile becomes guards."""
    tile = 16
    while tile < largest and tile < n:
        tile *= 2
    return tile


def _dot_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"  # ignored for bf16/fp16 operands


def _shape_constants(q: Tensor, n_keys, block_m: int, block_n: int, is_causal: bool) -> dict:
    """The kernels' compile-time arguments that the shape and dtype fix."""
    n_queries, d = q.shape[1], int(q.shape[2])  # int(): d specializes under torch.compile
    block_d = _tile(d, MAX_HEAD_DIM)
    return dict(SCALE=1.0 / math.sqrt(d), D=d, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
                IS_CAUSAL=is_causal, EVEN_M=bool(n_queries % block_m == 0),
                EVEN_N=bool(n_keys % block_n == 0), EVEN_D=d == block_d,
                DOT_PRECISION=_dot_precision(q.dtype))


class Tiles(NamedTuple):
    """A launch's tile sizes and its warps and software-pipelining stages."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _forward_tiles(n_queries, n_keys, d: int, dtype: torch.dtype) -> Tiles:
    """The forward kernel's tiles; BLOCK_N divides BLOCK_M, so the causal band is whole key
    tiles."""
    if dtype == torch.float32:  # full-fp32 dots run on the FMA units: small tiles, no spills
        block_m, block_n = 32, (32 if d <= 128 else 16)
    else:
        block_m, block_n = (128 if d <= 64 else 64), (64 if d <= 128 else 32)
    block_m = _tile(n_queries, block_m)
    block_n = _tile(n_keys, min(block_n, block_m))
    return Tiles(block_m, block_n, 4 if block_m <= 64 else 8, 2)


def _backward_tiles(n_queries, n_keys, d: int, dtype: torch.dtype) -> tuple[Tiles, Tiles]:
    """The tiles of the dK/dV pass and of the dQ pass. Each walks inner tiles inside its own
    outer tile (query tiles inside a key tile, key tiles inside a query tile), so the inner tile
    divides the outer one and the causal band is whole inner tiles. For 16-bit inputs up to
    d 128, from sweeps on an H200 (bf16, causal, 16 x 16384; tiles 32 to 128, 4 or 8 warps, 1 to
    3 stages, each pass on its own): dK/dV fastest with 64 x 64 tiles and 4 warps (3 stages at
    d 64, 2 at d 128; 32-wide tiles were 2.8x slower at d 128), dQ with 128 query rows over 64
    keys, 8 warps and 3 stages."""
    if dtype == torch.float32:  # full-fp32 dots run on the FMA units: small tiles, no spills
        side = 16 if d > 128 else 32
        dkdv = dq = Tiles(side, side, 4 if d <= 128 else 8, 2)
    elif d > 128:
        dkdv = dq = Tiles(32, 32, 8, 2)
    else:
        dkdv, dq = Tiles(64, 64, 4, 3 if d <= 64 else 2), Tiles(128, 64, 8, 3)
    dkdv_n, dq_m = _tile(n_keys, dkdv.block_n), _tile(n_queries, dq.block_m)
    return (dkdv._replace(block_m=_tile(n_queries, min(dkdv.block_m, dkdv_n)), block_n=dkdv_n),
            dq._replace(block_m=dq_m, block_n=_tile(n_keys, min(dq.block_n, dq_m))))


def _forward_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    """The forward operator's outputs, real or fake: o (contiguous, like q) and the logsumexp L
    (batch, n_queries) in fp32."""
    return q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=torch.float32)


def _backward_outputs(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The backward operator's outputs, real or fake: dQ, dK, dV, contiguous."""
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _flash_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, wrap=wrap_triton
               ) -> tuple[Tensor, Tensor]:
    """o (shaped like q, contiguous) and the logsumexp L (batch, n_queries) in fp32, from q, k, v
    of any strides."""
    check_attention_inputs(q, k, v)
    require_triton_device(q, k, v)
    batch, n_queries, d = q.shape
    n_keys = k.shape[1]
    o, logsumexp = _forward_outputs(q)
    tiles = _forward_tiles(n_queries, n_keys, d, q.dtype)
    wrap(flash_fwd_kernel)[(triton.cdiv(n_queries, tiles.block_m), batch)](
        q, k, v, o, logsumexp,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *logsumexp.stride(),
        n_queries, n_keys, **_shape_constants(q, n_keys, tiles.block_m, tiles.block_n, is_causal),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return o, logsumexp


def _flash_attn_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    return _flash_fwd(q, k, v, is_causal)


flash_attn_fwd = triton_op("cs336::flash_attn_fwd", _flash_attn_fwd, mutates_args=())


# Explicit fakes: triton_op's own would run the body, which under TRITON_INTERPRET=1 launches the
# interpreter on tensors without data.
@flash_attn_fwd.register_fake
def _flash_attn_fwd_fake(q: Tensor, k: Tensor, v: Tensor, is_causal: bool
                         ) -> tuple[Tensor, Tensor]:
    check_attention_inputs(q, k, v)
    return _forward_outputs(q)


def _flash_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, logsumexp: Tensor,
               grad_o: Tensor, is_causal: bool, wrap=wrap_triton
               ) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV (contiguous) from the forward's inputs, o and L, and dO."""
    # q, o and dO share one layout (contiguous), as do k and v, and the gradients
    q, k, v, o, grad_o = (t.contiguous() for t in (q, k, v, o, grad_o))
    batch, n_queries, d = q.shape
    n_keys = k.shape[1]
    delta = (grad_o.float() * o.float()).sum(dim=-1)                   # D = rowsum(dO * O)
    grad_q, grad_k, grad_v = _backward_outputs(q, k, v)
    dkdv, dq = _backward_tiles(n_queries, n_keys, d, q.dtype)

    def launch(tiles: Tiles) -> dict:
        return dict(**_shape_constants(q, n_keys, tiles.block_m, tiles.block_n, is_causal),
                    num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    strides = (*q.stride(), *k.stride(), *logsumexp.stride())
    wrap(flash_bwd_dkdv_kernel)[(triton.cdiv(n_keys, dkdv.block_n), batch)](
        q, k, v, grad_o, logsumexp, delta, grad_k, grad_v, *strides, n_queries, n_keys,
        **launch(dkdv))
    wrap(flash_bwd_dq_kernel)[(triton.cdiv(n_queries, dq.block_m), batch)](
        q, k, v, grad_o, logsumexp, delta, grad_q, *strides, n_queries, n_keys, **launch(dq))
    return grad_q, grad_k, grad_v


def _flash_attn_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, logsumexp: Tensor,
                    grad_o: Tensor, is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _flash_bwd(q, k, v, o, logsumexp, grad_o, is_causal)


flash_attn_bwd = triton_op("cs336::flash_attn_bwd", _flash_attn_bwd, mutates_args=())


@flash_attn_bwd.register_fake
def _flash_attn_bwd_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, logsumexp: Tensor,
                         grad_o: Tensor, is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_outputs(q, k, v)


# --- autograd: the operator's, and the assignment's autograd.Function --------------------------

def _direct(*tensors: Tensor) -> bool:
    """Whether to launch the kernels directly rather than through the operators: in eager mode
    on plain tensors. Torch's custom-operator dispatch costs about 0.5 ms of host time per
    forward+backward (torch 2.11, H200), more than the kernels themselves at small shapes, and
    wrap_triton outside an operator more still; torch.compile (and fake or functional tensors)
    goes through the operators."""
    return not torch.compiler.is_compiling() and all(type(t) is Tensor for t in tensors)


def _unwrapped(kernel):
    return kernel


def _save_for_backward(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    """Keeps L, q, k, v and o, the tensors the assignment's backward reads, and the mask flag."""
    q, k, v, is_causal = inputs
    o, logsumexp = output
    ctx.save_for_backward(logsumexp, q, k, v, o)
    ctx.is_causal = is_causal


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    _save_for_backward(ctx, inputs, output)
    ctx.mark_non_differentiable(output[1])  # L is for the backward; no gradient flows into it


def _backward(ctx, grad_o: Tensor, *_grad_logsumexp) -> tuple[Tensor, Tensor, Tensor, None]:
    logsumexp, q, k, v, o = ctx.saved_tensors
    if _direct(q, grad_o):
        grads = _flash_bwd(q, k, v, o, logsumexp, grad_o, ctx.is_causal, wrap=_unwrapped)
    else:
        grads = torch.ops.cs336.flash_attn_bwd(q, k, v, o, logsumexp, grad_o, ctx.is_causal)
    return *grads, None


flash_attn_fwd.register_autograd(_backward, setup_context=_setup_context)


class FlashAttentionTriton(torch.autograd.Function):
    """`FlashAttentionTriton.apply(q, k, v, is_causal=False)` -> o: Triton forward and backward,
    the `cs336::flash_attn_fwd` and `cs336::flash_attn_bwd` operators (their bodies directly in
    eager mode, see `_direct`)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        if _direct(q):
            output = _flash_fwd(q, k, v, is_causal, wrap=_unwrapped)
        else:
            output = torch.ops.cs336.flash_attn_fwd(q, k, v, is_causal)
        _save_for_backward(ctx, (q, k, v, is_causal), output)
        return output[0]

    backward = staticmethod(_backward)


class FlashAttentionTritonTorchBackward(FlashAttentionTriton):
    """The Triton forward with the compiled-PyTorch backward, for comparison."""

    @staticmethod
    def backward(ctx, grad_o: Tensor):
        logsumexp, q, k, v, o = ctx.saved_tensors
        grads = compiled_flash_backward(q, k, v, o, logsumexp, grad_o, ctx.is_causal)
        return *grads, None
