"""FlashAttention-2 in Triton: forward kernel; backward from key tiles (dK, dV) and from query
tiles (dQ), or with dQ added atomically from the key tiles (FlashAttention-2's scheme).

Shapes: q (batch, n_queries, d) or (batch, heads, n_queries, d), k and v likewise with n_keys,
any strides, any n_queries, n_keys >= 1 and 1 <= d <= 256 (`checks.check_attention_inputs`).
Heads are a grid axis, so the model's (batch, heads, seq, d) views of its fused projection are
read where they lie, without copies; outputs and gradients are written in (batch, seq, heads,
d) order, in which the model's merge of the heads is a view. The causal mask is SDPA's
`is_causal=True`: query i sees keys 0..i (`torch.ones(n_queries, n_keys).tril()`, aligned at the
top left), so every query sees at least key 0 and no row of the softmax is empty.

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

Forward (FlashAttention-2, Algorithm 1): the grid is (batch * heads, query tiles), heads
fastest, and under the causal mask the heaviest query tiles (the last ones) run first. Each
program loads one query tile, walks its key tiles once, and keeps the running row max m, row
sum l and output accumulator in fp32 registers; the max is taken on raw scores and the scale
folded into the exp2's argument (one multiply-add per score). P is cast to V's dtype before the
P V product. It writes O and the logsumexp L = m + log(l), the only extra tensor saved for
backward.

Backward (Algorithm 2), two launches: program (head, query tile) of the dQ kernel computes its
rows' D = rowsum(dO * O), stores it, and walks the key tiles its queries see for dQ; then
program (head, key tile) of the key-tile kernel reads D, walks the query tiles that see its keys
and keeps dK and dV in registers. Together they recompute S and dP (seven matmuls per score
tile, adding in a fixed order). With `atomic_dq` a small kernel computes D and zeroes an fp32 dQ
accumulator, and the key-tile kernel adds each query tile's dS K into it (FlashAttention-2's
scheme, five matmuls); it measured slower on an H100 (docs/measurements.md), so it is off by
default, and torch's deterministic-algorithms switch keeps it off.

Scores are kept in base 2 (exp2 is the hardware's instruction): S2 = Q K^T * scale * log2(e).
Causal masking adds -1e6 to scores of keys after the query. Pointer arithmetic only (no
`tl.make_block_ptr`, which Triton 3.9 removed).

Launch tiles come from `scripts/sweep_flash.py` on an H100 (see `_forward_tiles` and
`_backward_tiles`); where a shape's grid would leave multiprocessors idle (a few heads, short
sequences), the outer tile is halved until it fills them.

The kernels run inside two custom operators, `cs336::flash_attn_fwd` (q, k, v, is_causal ->
o, L) and `cs336::flash_attn_bwd` (q, k, v, o, L, dO, is_causal -> dQ, dK, dV), made with
`torch.library.triton_op`: torch.compile sees them as operators with fake (shape-only)
implementations instead of tracing Python kernel launches, and Inductor can still reach the
kernels. The forward operator is differentiable through the backward one. `FlashAttentionTriton`
is the assignment's autograd.Function over the same operators.

The kernels' two settings are arguments of each call, not module state: `precision`, how fp32
inputs multiply (`FP32_PRECISIONS`, default `DEFAULT_FP32_PRECISION`), and `atomic_dq`, where
the backward's dQ comes from.
"""

from __future__ import annotations

import functools
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
from cs336_systems.kernels.launch import Launch, direct, eager_on_plain_tensors

LOG2_E = tl.constexpr(1.4426950408889634)
LN_2 = tl.constexpr(0.6931471805599453)
CAUSAL_MASK_VALUE = tl.constexpr(-1e6)  # added to the scores of keys after the query


# --- tile helpers: masks only where a flag says the tile can overhang -------------------------

@triton.jit
def _head_base(ptr, head, N_HEADS, stride_z, stride_h):
    """The pointer to head `head` (batch * N_HEADS + h) of a (batch, heads, seq, d) tensor."""
    return ptr + (head // N_HEADS).to(tl.int64) * stride_z + (head % N_HEADS) * stride_h


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
def _add_tile(base_ptr, rows, stride_row, cols, stride_col, n_rows, n_cols, tile,
              EVEN_ROWS: tl.constexpr, EVEN_COLS: tl.constexpr):
    """Atomically adds the entries of `tile` that lie inside (n_rows, n_cols)."""
    ptrs = base_ptr + rows[:, None] * stride_row + cols[None, :] * stride_col
    if EVEN_ROWS:
        if EVEN_COLS:
            tl.atomic_add(ptrs, tile, sem="relaxed")
        else:
            tl.atomic_add(ptrs, tile, mask=(cols < n_cols)[None, :], sem="relaxed")
    else:
        if EVEN_COLS:
            tl.atomic_add(ptrs, tile, mask=(rows < n_rows)[:, None], sem="relaxed")
        else:
            tl.atomic_add(ptrs, tile, mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :],
                          sem="relaxed")


@triton.jit
def _load_rows(base_ptr, rows, n_rows, EVEN_ROWS: tl.constexpr):
    """One value per row (L or D, contiguous); rows past n_rows read as 0."""
    if EVEN_ROWS:
        values = tl.load(base_ptr + rows)
    else:
        values = tl.load(base_ptr + rows, mask=rows < n_rows, other=0.0)
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
def _query_ranges(k_start, N_QUERIES, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  IS_CAUSAL: tl.constexpr, EVEN_M: tl.constexpr):
    """(first, whole_end) for the key tile starting at k_start: the query tiles from `first`
    to whole_end see all of it without a mask; one more, up to N_QUERIES, overhangs. Under the
    causal mask `first` is past the band [k_start, k_start + BLOCK_N), which the caller walks
    separately; queries before k_start see none of the tile."""
    first = 0
    if IS_CAUSAL:
        first = k_start + BLOCK_N
    whole_end = N_QUERIES
    if not EVEN_M:
        whole_end = N_QUERIES // BLOCK_M * BLOCK_M
    return first, whole_end


# --- forward ---------------------------------------------------------------------------------

@triton.jit
def _fwd_key_tiles(acc, row_max, row_sum, q, q_rows, k_base, v_base,
                   stride_ks, stride_kd, stride_vs, stride_vd, cols, k_lo, k_hi, N_KEYS, qk_scale,
                   D: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
                   EVEN_D: tl.constexpr, BAND: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Alg. 1, lines 7-10, over the key tiles starting in [k_lo, k_hi). The running max is
    kept on scaled base-2 scores but taken on raw ones (the scale is positive), so a tile
    without a mask costs one multiply-add per score before its exp2."""
    for k_start in range(k_lo, k_hi, BLOCK_N):
        k_rows = k_start + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, k_rows, stride_ks, cols, stride_kd, N_KEYS, D, EVEN_N, EVEN_D)
        v = _load_tile(v_base, k_rows, stride_vs, cols, stride_vd, N_KEYS, D, EVEN_N, EVEN_D)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)          # line 8, S/scale
        if BAND or not EVEN_N:
            scores = scores * qk_scale
            if not EVEN_N:
                scores = tl.where((k_rows < N_KEYS)[None, :], scores, float("-inf"))
            if BAND:
                scores += tl.where(q_rows[:, None] >= k_rows[None, :], 0.0, CAUSAL_MASK_VALUE)
            new_max = tl.maximum(row_max, tl.max(scores, axis=1))                # line 9
            p = tl.exp2(scores - new_max[:, None])
        else:
            new_max = tl.maximum(row_max, tl.max(scores, axis=1) * qk_scale)
            p = tl.exp2(scores * qk_scale - new_max[:, None])
        correction = tl.exp2(row_max - new_max)
        row_sum = correction * row_sum + tl.sum(p, axis=1)
        acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v,              # line 10
                                                 input_precision=DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def flash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qz, stride_qh, stride_qs, stride_qd,
    stride_kz, stride_kh, stride_ks, stride_kd,
    stride_vz, stride_vh, stride_vs, stride_vd,
    stride_oz, stride_oh, stride_os, stride_od,
    N_HEADS, N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # program (head, query_tile) owns query rows [q_start, q_start + BLOCK_M) of one head. The
    # grid runs heads fastest; under the causal mask the last query tiles see the most keys, so
    # they take the first tile ids and the light ones fill the tail.
    head = tl.program_id(0)
    query_tile = tl.program_id(1)
    if IS_CAUSAL:
        query_tile = tl.num_programs(1) - 1 - query_tile
    q_start = query_tile * BLOCK_M
    q_rows = q_start + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    q = _load_tile(_head_base(q_ptr, head, N_HEADS, stride_qz, stride_qh), q_rows, stride_qs,
                   cols, stride_qd, N_QUERIES, D, EVEN_M, EVEN_D)
    k_base = _head_base(k_ptr, head, N_HEADS, stride_kz, stride_kh)
    v_base = _head_base(v_ptr, head, N_HEADS, stride_vz, stride_vh)

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
    _store_tile(_head_base(o_ptr, head, N_HEADS, stride_oz, stride_oh), q_rows, stride_os, cols,
                stride_od, N_QUERIES, D, o, EVEN_M, EVEN_D)
    lse_ptrs = lse_ptr + head.to(tl.int64) * N_QUERIES + q_rows
    if EVEN_M:
        tl.store(lse_ptrs, logsumexp)
    else:
        tl.store(lse_ptrs, logsumexp, mask=q_rows < N_QUERIES)


# --- backward with atomic dQ: D = rowsum(dO * O), and dQ's accumulator zeroed -----------------

@triton.jit
def _store_rows(base_ptr, rows, values, n_rows, EVEN_ROWS: tl.constexpr):
    """One fp32 value per row (D, contiguous); rows past n_rows are not stored."""
    if EVEN_ROWS:
        tl.store(base_ptr + rows, values)
    else:
        tl.store(base_ptr + rows, values, mask=rows < n_rows)


@triton.jit
def flash_bwd_prepare_kernel(
    o_ptr, do_ptr, delta_ptr, dq_ptr,
    stride_oz, stride_oh, stride_os, stride_od,
    stride_dz, stride_dh, stride_ds, stride_dd,
    stride_qz, stride_qh, stride_qs, stride_qd,
    N_HEADS, N_QUERIES,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_M: tl.constexpr,
    EVEN_D: tl.constexpr,
):
    """Program (head, query_tile), before the key-tile kernel adds dQ atomically: D for its
    rows, in fp32, and zeros in its rows of the fp32 dQ accumulator. (Without atomic adds the
    dQ kernel computes D itself.)"""
    head = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    o = _load_tile(_head_base(o_ptr, head, N_HEADS, stride_oz, stride_oh), rows, stride_os,
                   cols, stride_od, N_QUERIES, D, EVEN_M, EVEN_D)
    grad_o = _load_tile(_head_base(do_ptr, head, N_HEADS, stride_dz, stride_dh), rows,
                        stride_ds, cols, stride_dd, N_QUERIES, D, EVEN_M, EVEN_D)
    delta = tl.sum(o.to(tl.float32) * grad_o.to(tl.float32), axis=1)    # Alg. 2, line 4
    _store_rows(delta_ptr + head.to(tl.int64) * N_QUERIES, rows, delta, N_QUERIES, EVEN_M)
    _store_tile(_head_base(dq_ptr, head, N_HEADS, stride_qz, stride_qh), rows, stride_qs,
                cols, stride_qd, N_QUERIES, D, tl.zeros((BLOCK_M, BLOCK_D), tl.float32),
                EVEN_M, EVEN_D)


# --- backward, from each key tile: dK, dV, and dQ by atomic adds -----------------------------

@triton.jit
def _bwd_query_tiles(grad_k, grad_v, k, v, k_rows, q_base, do_base, dq_base, lse_base,
                     delta_base, stride_qs, stride_qd, stride_ds, stride_dd, stride_dqs,
                     stride_dqd, cols, q_lo, q_hi, N_QUERIES, N_KEYS, qk_scale,
                     SCALE: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                     EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                     BAND: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Alg. 2, lines 8-21, from one key tile's side over the query tiles starting in
    [q_lo, q_hi), in transposed form (keys as rows) so that dV and dK need no transposes.
    Overhanging query rows read q = dO = 0, so their P is finite and they add nothing;
    overhanging keys get P = 0, so that their dS adds nothing to dQ."""
    for q_start in range(q_lo, q_hi, BLOCK_M):
        q_rows = q_start + tl.arange(0, BLOCK_M)
        q = _load_tile(q_base, q_rows, stride_qs, cols, stride_qd, N_QUERIES, D, EVEN_M, EVEN_D)
        grad_o = _load_tile(do_base, q_rows, stride_ds, cols, stride_dd, N_QUERIES, D, EVEN_M,
                            EVEN_D)
        lse = _load_rows(lse_base, q_rows, N_QUERIES, EVEN_M) * LOG2_E
        delta = _load_rows(delta_base, q_rows, N_QUERIES, EVEN_M)
        scores_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)       # (N, M), S^T
        p_t = tl.exp2(scores_t * qk_scale - lse[None, :])                      # line 13
        if BAND:
            p_t = tl.where(q_rows[None, :] >= k_rows[:, None], p_t, 0.0)
        if ATOMIC_DQ and not EVEN_N:
            p_t = tl.where((k_rows < N_KEYS)[:, None], p_t, 0.0)
        grad_v += tl.dot(p_t.to(grad_o.dtype), grad_o, input_precision=DOT_PRECISION)  # 16
        grad_p_t = tl.dot(v, tl.trans(grad_o), input_precision=DOT_PRECISION)   # line 17
        grad_s_t = (p_t * (grad_p_t - delta[None, :])).to(q.dtype)              # line 18
        grad_k += tl.dot(grad_s_t, q, input_precision=DOT_PRECISION)            # line 20
        if ATOMIC_DQ:                                                           # line 19
            grad_q = tl.dot(tl.trans(grad_s_t), k, input_precision=DOT_PRECISION) * SCALE
            _add_tile(dq_base, q_rows, stride_dqs, cols, stride_dqd, N_QUERIES, D, grad_q,
                      EVEN_M, EVEN_D)
    return grad_k, grad_v


@triton.jit
def flash_bwd_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr,
    stride_qz, stride_qh, stride_qs, stride_qd,
    stride_kz, stride_kh, stride_ks, stride_kd,
    stride_vz, stride_vh, stride_vs, stride_vd,
    stride_dz, stride_dh, stride_ds, stride_dd,
    stride_dqz, stride_dqh, stride_dqs, stride_dqd,
    stride_dkz, stride_dkh, stride_dks, stride_dkd,
    N_HEADS, N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Program (head, key_tile) accumulates dK and dV for keys [k_start, k_start + BLOCK_N) in
    registers and, with ATOMIC_DQ, adds each query tile's share of dQ into an fp32 accumulator
    (FlashAttention-2's scheme: five matmuls per score tile). Without it dQ is left to
    `flash_bwd_dq_kernel`, which recomputes S and dP but adds in a fixed order. BLOCK_N is a
    multiple of BLOCK_M, so the causal band is whole query tiles. dK and dV share a layout."""
    head = tl.program_id(0)
    k_start = tl.program_id(1) * BLOCK_N  # under the causal mask the first key tiles are the
    k_rows = k_start + tl.arange(0, BLOCK_N)  # heaviest, and they start first
    cols = tl.arange(0, BLOCK_D)
    k = _load_tile(_head_base(k_ptr, head, N_HEADS, stride_kz, stride_kh), k_rows, stride_ks,
                   cols, stride_kd, N_KEYS, D, EVEN_N, EVEN_D)
    v = _load_tile(_head_base(v_ptr, head, N_HEADS, stride_vz, stride_vh), k_rows, stride_vs,
                   cols, stride_vd, N_KEYS, D, EVEN_N, EVEN_D)
    q_base = _head_base(q_ptr, head, N_HEADS, stride_qz, stride_qh)
    do_base = _head_base(do_ptr, head, N_HEADS, stride_dz, stride_dh)
    dq_base = _head_base(dq_ptr, head, N_HEADS, stride_dqz, stride_dqh)
    lse_base = lse_ptr + head.to(tl.int64) * N_QUERIES
    delta_base = delta_ptr + head.to(tl.int64) * N_QUERIES
    grad_k = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    grad_v = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    qk_scale = SCALE * LOG2_E

    first, whole_end = _query_ranges(k_start, N_QUERIES, BLOCK_M, BLOCK_N, IS_CAUSAL, EVEN_M)
    grad_k, grad_v = _bwd_query_tiles(
        grad_k, grad_v, k, v, k_rows, q_base, do_base, dq_base, lse_base, delta_base, stride_qs,
        stride_qd, stride_ds, stride_dd, stride_dqs, stride_dqd, cols, first, whole_end,
        N_QUERIES, N_KEYS, qk_scale, SCALE, D, BLOCK_M, True, EVEN_N, EVEN_D, False, ATOMIC_DQ,
        DOT_PRECISION)
    if not EVEN_M:  # the query tile that overhangs N_QUERIES, when past the band
        grad_k, grad_v = _bwd_query_tiles(
            grad_k, grad_v, k, v, k_rows, q_base, do_base, dq_base, lse_base, delta_base,
            stride_qs, stride_qd, stride_ds, stride_dd, stride_dqs, stride_dqd, cols,
            tl.maximum(first, whole_end), N_QUERIES, N_QUERIES, N_KEYS, qk_scale, SCALE, D,
            BLOCK_M, False, EVEN_N, EVEN_D, False, ATOMIC_DQ, DOT_PRECISION)
    if IS_CAUSAL:
        grad_k, grad_v = _bwd_query_tiles(
            grad_k, grad_v, k, v, k_rows, q_base, do_base, dq_base, lse_base, delta_base,
            stride_qs, stride_qd, stride_ds, stride_dd, stride_dqs, stride_dqd, cols, k_start,
            tl.minimum(k_start + BLOCK_N, N_QUERIES), N_QUERIES, N_KEYS, qk_scale, SCALE, D,
            BLOCK_M, EVEN_M, EVEN_N, EVEN_D, True, ATOMIC_DQ, DOT_PRECISION)

    _store_tile(_head_base(dk_ptr, head, N_HEADS, stride_dkz, stride_dkh), k_rows, stride_dks,
                cols, stride_dkd, N_KEYS, D, grad_k * SCALE, EVEN_N, EVEN_D)
    _store_tile(_head_base(dv_ptr, head, N_HEADS, stride_dkz, stride_dkh), k_rows, stride_dks,
                cols, stride_dkd, N_KEYS, D, grad_v, EVEN_N, EVEN_D)


# --- backward, deterministic dQ: from each query tile ----------------------------------------

@triton.jit
def _dq_key_tiles(grad_q, q, grad_o, lse, delta, q_rows, k_base, v_base, stride_ks, stride_kd,
                  stride_vs, stride_vd, cols, k_lo, k_hi, N_KEYS, qk_scale,
                  D: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
                  EVEN_D: tl.constexpr, BAND: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Alg. 2 from one query tile's side, over the key tiles starting in [k_lo, k_hi)."""
    for k_start in range(k_lo, k_hi, BLOCK_N):
        k_rows = k_start + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, k_rows, stride_ks, cols, stride_kd, N_KEYS, D, EVEN_N, EVEN_D)
        v = _load_tile(v_base, k_rows, stride_vs, cols, stride_vd, N_KEYS, D, EVEN_N, EVEN_D)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p = tl.exp2(scores * qk_scale - lse[:, None])
        if BAND:
            p = tl.where(q_rows[:, None] >= k_rows[None, :], p, 0.0)
        if not EVEN_N:  # overhanging keys read k = 0, and exp(0 - L) may overflow
            p = tl.where((k_rows < N_KEYS)[None, :], p, 0.0)
        grad_p = tl.dot(grad_o, tl.trans(v), input_precision=DOT_PRECISION)
        grad_s = p * (grad_p - delta[:, None])
        grad_q += tl.dot(grad_s.to(k.dtype), k, input_precision=DOT_PRECISION)
    return grad_q


@triton.jit
def flash_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_qz, stride_qh, stride_qs, stride_qd,
    stride_kz, stride_kh, stride_ks, stride_kd,
    stride_vz, stride_vh, stride_vs, stride_vd,
    stride_oz, stride_oh, stride_os, stride_od,
    stride_dz, stride_dh, stride_ds, stride_dd,
    stride_dqz, stride_dqh, stride_dqs, stride_dqd,
    N_HEADS, N_QUERIES, N_KEYS,
    SCALE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (head, query_tile) computes D = rowsum(dO * O) for queries [q_start, q_start +
    BLOCK_M), stores it for the key-tile kernel (launched after this one), and accumulates
    their dQ in a fixed order. BLOCK_M is a multiple of BLOCK_N, so the band is whole key
    tiles."""
    head = tl.program_id(0)
    query_tile = tl.program_id(1)
    if IS_CAUSAL:
        query_tile = tl.num_programs(1) - 1 - query_tile
    q_start = query_tile * BLOCK_M
    q_rows = q_start + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    q = _load_tile(_head_base(q_ptr, head, N_HEADS, stride_qz, stride_qh), q_rows, stride_qs,
                   cols, stride_qd, N_QUERIES, D, EVEN_M, EVEN_D)
    grad_o = _load_tile(_head_base(do_ptr, head, N_HEADS, stride_dz, stride_dh), q_rows,
                        stride_ds, cols, stride_dd, N_QUERIES, D, EVEN_M, EVEN_D)
    o = _load_tile(_head_base(o_ptr, head, N_HEADS, stride_oz, stride_oh), q_rows, stride_os,
                   cols, stride_od, N_QUERIES, D, EVEN_M, EVEN_D)
    delta = tl.sum(o.to(tl.float32) * grad_o.to(tl.float32), axis=1)    # Alg. 2, line 4
    _store_rows(delta_ptr + head.to(tl.int64) * N_QUERIES, q_rows, delta, N_QUERIES, EVEN_M)
    lse = _load_rows(lse_ptr + head.to(tl.int64) * N_QUERIES, q_rows, N_QUERIES, EVEN_M) * LOG2_E
    k_base = _head_base(k_ptr, head, N_HEADS, stride_kz, stride_kh)
    v_base = _head_base(v_ptr, head, N_HEADS, stride_vz, stride_vh)
    grad_q = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    qk_scale = SCALE * LOG2_E

    whole_end, seen_end = _key_ranges(q_start, N_KEYS, BLOCK_N, IS_CAUSAL, EVEN_N)
    grad_q = _dq_key_tiles(grad_q, q, grad_o, lse, delta, q_rows, k_base, v_base, stride_ks,
                           stride_kd, stride_vs, stride_vd, cols, 0, whole_end, N_KEYS, qk_scale,
                           D, BLOCK_N, True, EVEN_D, False, DOT_PRECISION)
    if not EVEN_N:
        grad_q = _dq_key_tiles(grad_q, q, grad_o, lse, delta, q_rows, k_base, v_base, stride_ks,
                               stride_kd, stride_vs, stride_vd, cols, whole_end, seen_end,
                               N_KEYS, qk_scale, D, BLOCK_N, False, EVEN_D, False, DOT_PRECISION)
    if IS_CAUSAL:
        grad_q = _dq_key_tiles(grad_q, q, grad_o, lse, delta, q_rows, k_base, v_base, stride_ks,
                               stride_kd, stride_vs, stride_vd, cols, q_start,
                               tl.minimum(q_start + BLOCK_M, N_KEYS), N_KEYS, qk_scale, D,
                               BLOCK_N, EVEN_N, EVEN_D, True, DOT_PRECISION)

    _store_tile(_head_base(dq_ptr, head, N_HEADS, stride_dqz, stride_dqh), q_rows, stride_dqs,
                cols, stride_dqd, N_QUERIES, D, grad_q * SCALE, EVEN_M, EVEN_D)


# --- launch configuration ------------------------------------------------------------------

def _tile(n, largest: int) -> int:
    """The least power of two >= n, at least 16 (tl.dot's least tile) and at most `largest`.
    Only comparisons, so a symbolic n under torch.compile becomes guards."""
    tile = 16
    while tile < largest and tile < n:
        tile *= 2
    return tile


FP32_PRECISIONS = ("ieee", "tf32x3", "tf32")
# How fp32 inputs multiply: "ieee" on the FMA units in full fp32; "tf32" on the tensor cores
# with 10-bit mantissas (relative error about 1e-3, inside the assignment's 1e-2); "tf32x3"
# splits each operand in two tf32 parts and keeps three of the four products (about fp32's
# accuracy at three tensor-core dots). `FlashAttentionTriton.apply`'s `precision` picks one.
DEFAULT_FP32_PRECISION = "tf32x3"


def _check_precision(precision: str) -> None:
    if precision not in FP32_PRECISIONS:
        raise ValueError(f"unknown fp32 precision {precision!r}; allowed: "
                         f"{', '.join(FP32_PRECISIONS)}")


def _dot_precision(dtype: torch.dtype, precision: str) -> str:
    _check_precision(precision)
    return precision if dtype == torch.float32 else "tf32"  # 16-bit dots ignore it


def _shape_constants(n_queries, n_keys, d: int, dtype: torch.dtype, block_m: int,
                     block_n: int, is_causal: bool, precision: str) -> dict:
    """The kernels' compile-time arguments that the shape and dtype fix."""
    block_d = _tile(d, MAX_HEAD_DIM)
    return dict(SCALE=1.0 / math.sqrt(d), D=d, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
                IS_CAUSAL=is_causal, EVEN_M=bool(n_queries % block_m == 0),
                EVEN_N=bool(n_keys % block_n == 0), EVEN_D=d == block_d,
                DOT_PRECISION=_dot_precision(dtype, precision))


class Tiles(NamedTuple):
    """A launch's tile sizes (query rows, key rows) and its warps and pipelining stages."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@functools.lru_cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: no grid to fill
    return torch.cuda.get_device_properties(device).multi_processor_count


def _fill(programs, tile: int, least: int, multiprocessors: int) -> int:
    """`tile` halved (down to `least`) while `programs(tile)` leaves multiprocessors idle."""
    while tile > least and programs(tile) < multiprocessors:
        tile //= 2
    return tile


def _forward_tiles(heads, n_queries, n_keys, d: int, dtype: torch.dtype, precision: str,
                   sms: int = 1) -> Tiles:
    """The forward kernel's tiles, from `scripts/sweep_flash.py` on an H100 (causal, bf16 unless
    said; 10 tile sets, the best within 3% of each other merged into one rule): 128-row query
    tiles over 64 keys beyond 2048 tokens (4 warps and 3 stages at d 64, 8 and 4 at d 80 to
    128); 64 x 64 with 4 warps and 3 stages up to 2048 tokens at d 64; fp32 128 x 32 (tf32) or
    128 x 64 (tf32x3) with 8 warps, 32 x 32 in IEEE, and 64 query rows above d 64. Where the grid would leave
    multiprocessors idle, the query tile halves down to 64 rows. BLOCK_N divides BLOCK_M, so the
    causal band is whole key tiles."""
    if dtype == torch.float32:
        block_m, block_n, warps, stages = {"ieee": (32, 32, 4, 2), "tf32": (128, 32, 8, 2),
                                           "tf32x3": (128, 64, 8, 2)}[precision]
        if d > 128:
            block_m, block_n, warps = 32, 16, 4
        elif d > 64:  # 128 fp32 query rows at d 128 ask 256 KiB of shared memory (H200: 227)
            block_m = min(block_m, 64)
    elif d > 128:
        block_m, block_n, warps, stages = 64, 32, 4, 2
    elif d > 64:
        block_m, block_n, warps, stages = 128, 64, 8, 4
    elif n_queries > 2048:
        block_m, block_n, warps, stages = 128, 64, 4, 3
    else:
        block_m, block_n, warps, stages = 64, 64, 4, 3
    block_m = _fill(lambda m: heads * triton.cdiv(n_queries, m), _tile(n_queries, block_m),
                    min(64, block_m), sms)
    block_n = _tile(n_keys, min(block_n, block_m))
    return Tiles(block_m, block_n, warps if block_m > 64 else 4, stages)


def _backward_tiles(heads, n_queries, n_keys, d: int, dtype: torch.dtype, precision: str,
                    atomic: bool = False) -> tuple[Tiles, Tiles]:
    """The tiles of the key-tile kernel (query tiles inside a key tile) and of the dQ kernel
    (key tiles inside a query tile): each inner tile divides its outer one, so the causal band
    is whole inner tiles. 16-bit, from `scripts/sweep_flash.py` on an H100 (8 tile sets): the
    key-tile kernel fastest with 64 x 64 tiles and 4 warps, 3 stages at d 64 and 2 above; the
    dQ kernel with 128 query rows over 64 keys, 8 warps and 3 stages (an H200 sweep). With
    atomic dQ the key-tile kernel also holds a dQ tile, and its fastest tiles were 64 query
    rows over 128 keys with 8 warps and 3 stages at d 64 and 128 (an H100 sweep)."""
    if dtype == torch.float32 and precision == "ieee":
        side = 16 if d > 128 else 32
        keys = dq = Tiles(side, side, 4 if d <= 128 else 8, 2)
    elif dtype == torch.float32 or d > 128:
        keys = dq = Tiles(32, 32, 8 if d > 128 else 4, 2)
    elif atomic:
        keys, dq = Tiles(64, 128, 8, 3), Tiles(128, 64, 8, 3)
    else:
        keys, dq = Tiles(64, 64, 4, 3 if d <= 64 else 2), Tiles(128, 64, 8, 3)
    keys_n, dq_m = _tile(n_keys, keys.block_n), _tile(n_queries, dq.block_m)
    return (keys._replace(block_m=_tile(n_queries, min(keys.block_m, keys_n)), block_n=keys_n),
            dq._replace(block_m=dq_m, block_n=_tile(n_keys, min(dq.block_n, dq_m))))


def _dims(t: Tensor) -> tuple:
    """(batch, heads, seq, d) of a (batch, heads, seq, d) tensor; a (batch, seq, d) one has one
    head. d is an int: it specializes under torch.compile."""
    shape = t.shape
    if len(shape) == 3:
        return shape[0], 1, shape[1], int(shape[2])
    return shape[0], shape[1], shape[2], int(shape[3])


def _like_heads(t: Tensor, dtype=None) -> Tensor:
    """An empty tensor shaped like `t` in (batch, seq, heads, d) memory order, the order in
    which (batch, heads, seq, d) -> (batch, seq, heads * d) is a view."""
    shape = tuple(t.shape)
    if len(shape) == 3:
        return t.new_empty(shape, dtype=dtype)
    batch, heads, seq, d = shape
    return t.new_empty((batch, seq, heads, d), dtype=dtype).transpose(1, 2)


def _forward_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    """The forward operator's outputs, real or fake: o, shaped like q in (batch, seq, heads, d)
    order, and the logsumexp L, q's shape without d, contiguous fp32."""
    return _like_heads(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _backward_outputs(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The backward operator's outputs, real or fake: dQ, dK, dV in (batch, seq, heads, d)
    order (dK and dV sharing a layout)."""
    return _like_heads(q), _like_heads(k), _like_heads(v)


def _strides(*tensors: Tensor) -> list:
    """Each tensor's (batch, heads, seq, d) strides, in turn; one head has head stride 0."""
    strides = []
    for t in tensors:
        stride = t.stride()
        strides.extend((stride[0], 0, stride[1], stride[2]) if len(stride) == 3 else stride)
    return strides


def _static(*sizes) -> bool:
    """Whether the sizes are plain ints (not symbolic under torch.compile), so a launch plan
    made for them can be cached."""
    return all(type(size) is int for size in sizes)


def _forward_launch(heads, n_queries, n_keys, d: int, dtype: torch.dtype, is_causal: bool,
                    precision: str, sms: int, tiles: Tiles | None = None) -> Launch:
    tiles = tiles or _forward_tiles(heads, n_queries, n_keys, d, dtype, precision, sms)
    return Launch((heads, triton.cdiv(n_queries, tiles.block_m)),
                  dict(**_shape_constants(n_queries, n_keys, d, dtype, tiles.block_m,
                                          tiles.block_n, is_causal, precision),
                       num_warps=tiles.num_warps, num_stages=tiles.num_stages))


_cached_forward_launch = functools.lru_cache(maxsize=1024)(_forward_launch)


def _flash_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, precision: str,
               wrap=wrap_triton, tiles: Tiles | None = None) -> tuple[Tensor, Tensor]:
    """o and the logsumexp L from q, k, v of any strides: (batch, seq, d) or
    (batch, heads, seq, d). One launch; its plan is cached per shape. `tiles` overrides the
    launch's (for sweeps)."""
    check_attention_inputs(q, k, v, heads=True)
    _check_precision(precision)
    require_triton_device(q, k, v)
    o, logsumexp = _forward_outputs(q)
    batch, n_heads, n_queries, d = _dims(q)
    n_keys = k.shape[-2]
    heads = batch * n_heads
    plan = _cached_forward_launch if tiles is None and _static(heads, n_queries, n_keys) \
        else _forward_launch
    launch = plan(heads, n_queries, n_keys, d, q.dtype, is_causal, precision,
                  _multiprocessors(q.device), tiles)
    wrap(flash_fwd_kernel)[launch.grid](
        q, k, v, o, logsumexp, *_strides(q, k, v, o), n_heads, n_queries, n_keys,
        **launch.kwargs)
    return o, logsumexp


def _flash_attn_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, precision: str
                    ) -> tuple[Tensor, Tensor]:
    return _flash_fwd(q, k, v, is_causal, precision)


flash_attn_fwd = triton_op("cs336::flash_attn_fwd", _flash_attn_fwd, mutates_args=())


# Explicit fakes: triton_op's own would run the body, which under TRITON_INTERPRET=1 launches the
# interpreter on tensors without data.
@flash_attn_fwd.register_fake
def _flash_attn_fwd_fake(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, precision: str
                         ) -> tuple[Tensor, Tensor]:
    check_attention_inputs(q, k, v, heads=True)
    return _forward_outputs(q)


# Where dQ comes from: atomic adds from the key-tile kernel (FlashAttention-2's scheme, five
# matmuls per score tile) or its own kernel over query tiles (seven, adding in a fixed order).
# The default is its own kernel, deterministic and the faster at long sequences (the timings:
# docs/measurements.md, "Where dQ comes from"); with `atomic_dq` asked for, torch's
# deterministic-algorithms switch still forces it.
def _atomic(atomic_dq: bool) -> bool:
    return atomic_dq and not torch.are_deterministic_algorithms_enabled()


class BackwardLaunches(NamedTuple):
    """The backward's launches: the key-tile kernel's, and either the dQ kernel's (which also
    computes D) or, with atomic dQ, the prepare kernel's (D and the zeroed accumulator)."""
    keys: Launch
    dq: Launch | None
    prepare: Launch | None


def _backward_launches(heads, n_queries, n_keys, d: int, dtype: torch.dtype, is_causal: bool,
                       precision: str, atomic: bool,
                       tiles: tuple[Tiles, Tiles] | None = None) -> BackwardLaunches:
    keys, dq = tiles or _backward_tiles(heads, n_queries, n_keys, d, dtype, precision, atomic)
    key_constants = _shape_constants(n_queries, n_keys, d, dtype, keys.block_m, keys.block_n,
                                     is_causal, precision)
    key_tiles = Launch((heads, triton.cdiv(n_keys, keys.block_n)),
                       dict(**key_constants, ATOMIC_DQ=atomic, num_warps=keys.num_warps,
                            num_stages=keys.num_stages))
    if atomic:
        prepare = Launch((heads, triton.cdiv(n_queries, keys.block_m)),
                         dict(D=d, BLOCK_D=key_constants["BLOCK_D"], BLOCK_M=keys.block_m,
                              EVEN_M=key_constants["EVEN_M"], EVEN_D=key_constants["EVEN_D"],
                              num_warps=4))
        return BackwardLaunches(key_tiles, None, prepare)
    query_tiles = Launch((heads, triton.cdiv(n_queries, dq.block_m)),
                         dict(**_shape_constants(n_queries, n_keys, d, dtype, dq.block_m,
                                                 dq.block_n, is_causal, precision),
                              num_warps=dq.num_warps, num_stages=dq.num_stages))
    return BackwardLaunches(key_tiles, query_tiles, None)


_cached_backward_launches = functools.lru_cache(maxsize=1024)(_backward_launches)


def _flash_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, logsumexp: Tensor,
               grad_o: Tensor, is_causal: bool, precision: str, atomic_dq: bool = False,
               wrap=wrap_triton, tiles: tuple[Tiles, Tiles] | None = None
               ) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from the forward's inputs, o and L, and dO, any strides: two launches (the dQ
    kernel, which also computes D, then the key-tile kernel, which reads D), or with atomic
    adds two and a cast (D and the zeroed fp32 dQ accumulator, then the key-tile kernel adding
    into it, with `atomic_dq` outside deterministic mode); plans cached per shape; `tiles`
    overrides (for sweeps)."""
    atomic = _atomic(atomic_dq)
    batch, n_heads, n_queries, d = _dims(q)
    n_keys = k.shape[-2]
    heads = batch * n_heads
    plan = _cached_backward_launches if tiles is None and _static(heads, n_queries, n_keys) \
        else _backward_launches
    launches = plan(heads, n_queries, n_keys, d, q.dtype, is_causal, precision, atomic, tiles)
    # with atomic adds, dQ accumulates in fp32 (in place for fp32 inputs), then is cast
    grad_q, grad_k, grad_v = _backward_outputs(q, k, v) if q.dtype == torch.float32 \
        or not atomic else (None, _like_heads(k), _like_heads(v))
    logsumexp = logsumexp.contiguous()
    delta = torch.empty_like(logsumexp)                                # D = rowsum(dO * O)
    if atomic:
        accumulate = grad_q if grad_q is not None else _like_heads(q, dtype=torch.float32)
        wrap(flash_bwd_prepare_kernel)[launches.prepare.grid](
            o, grad_o, delta, accumulate, *_strides(o, grad_o, accumulate), n_heads, n_queries,
            **launches.prepare.kwargs)
    else:
        accumulate = grad_q  # not written by the key-tile kernel without atomic adds
        wrap(flash_bwd_dq_kernel)[launches.dq.grid](
            q, k, v, o, grad_o, logsumexp, delta, grad_q,
            *_strides(q, k, v, o, grad_o, grad_q), n_heads, n_queries, n_keys,
            **launches.dq.kwargs)
    wrap(flash_bwd_kernel)[launches.keys.grid](
        q, k, v, grad_o, logsumexp, delta, accumulate, grad_k, grad_v,
        *_strides(q, k, v, grad_o, accumulate, grad_k), n_heads, n_queries, n_keys,
        **launches.keys.kwargs)
    if grad_q is None:
        grad_q = accumulate.to(q.dtype)  # keeps the (batch, seq, heads, d) order
    return grad_q, grad_k, grad_v


def _flash_attn_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, logsumexp: Tensor,
                    grad_o: Tensor, is_causal: bool, precision: str, atomic_dq: bool
                    ) -> tuple[Tensor, Tensor, Tensor]:
    return _flash_bwd(q, k, v, o, logsumexp, grad_o, is_causal, precision, atomic_dq)


flash_attn_bwd = triton_op("cs336::flash_attn_bwd", _flash_attn_bwd, mutates_args=())


@flash_attn_bwd.register_fake
def _flash_attn_bwd_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, logsumexp: Tensor,
                         grad_o: Tensor, is_causal: bool, precision: str, atomic_dq: bool
                         ) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_outputs(q, k, v)


# --- autograd: the operator's, and the assignment's autograd.Function --------------------------

def _save_for_backward(ctx, inputs: tuple, output: tuple[Tensor, Tensor],
                       atomic_dq: bool = False) -> None:
    """Keeps L, q, k, v and o, the tensors the assignment's backward reads, the mask flag, the
    fp32 precision (so that the backward multiplies as the forward did) and where dQ comes
    from."""
    q, k, v, is_causal, precision = inputs
    o, logsumexp = output
    ctx.save_for_backward(logsumexp, q, k, v, o)
    ctx.is_causal = is_causal
    ctx.precision = precision
    ctx.atomic_dq = atomic_dq


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    _save_for_backward(ctx, inputs, output)
    ctx.mark_non_differentiable(output[1])  # L is for the backward; no gradient flows into it


def _gradients(ctx, grad_o: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from what `_save_for_backward` kept."""
    logsumexp, q, k, v, o = ctx.saved_tensors
    args = (q, k, v, o, logsumexp, grad_o, ctx.is_causal, ctx.precision, ctx.atomic_dq)
    if eager_on_plain_tensors(q, grad_o):
        return _flash_bwd(*args, wrap=direct)
    return torch.ops.cs336.flash_attn_bwd(*args)


def _backward(ctx, grad_o: Tensor, *_grad_logsumexp) -> tuple[Tensor | None, ...]:
    return *_gradients(ctx, grad_o), None, None  # none for is_causal, precision


flash_attn_fwd.register_autograd(_backward, setup_context=_setup_context)


class FlashAttentionTriton(torch.autograd.Function):
    """`FlashAttentionTriton.apply(q, k, v, is_causal=False, precision=DEFAULT_FP32_PRECISION,
    atomic_dq=False)` -> o: Triton forward and backward, the `cs336::flash_attn_fwd` and
    `cs336::flash_attn_bwd` operators (their bodies directly in eager mode:
    `launch.eager_on_plain_tensors`).
    `precision` is fp32 inputs' (one of FP32_PRECISIONS), the backward multiplying as the
    forward did; `atomic_dq` adds dQ atomically from the key-tile kernel (outside torch's
    deterministic mode) instead of its own kernel."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                precision: str = DEFAULT_FP32_PRECISION, atomic_dq: bool = False) -> Tensor:
        if eager_on_plain_tensors(q):
            output = _flash_fwd(q, k, v, is_causal, precision, wrap=direct)
        else:
            output = torch.ops.cs336.flash_attn_fwd(q, k, v, is_causal, precision)
        _save_for_backward(ctx, (q, k, v, is_causal, precision), output, atomic_dq)
        return output[0]

    @staticmethod
    def backward(ctx, grad_o: Tensor) -> tuple[Tensor | None, ...]:
        return *_gradients(ctx, grad_o), None, None, None  # is_causal, precision, atomic_dq


class FlashAttentionTritonTorchBackward(FlashAttentionTriton):
    """The Triton forward with the compiled-PyTorch backward, for comparison."""

    @staticmethod
    def backward(ctx, grad_o: Tensor):
        logsumexp, q, k, v, o = ctx.saved_tensors
        grads = compiled_flash_backward(q, k, v, o, logsumexp, grad_o, ctx.is_causal)
        return *grads, None, None, None
