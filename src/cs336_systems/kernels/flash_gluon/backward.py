"""The FlashAttention-2 backward's kernels (Algorithm 2): the query-tile kernel (dQ and D), the
key-tile kernel (dK and dV, with dQ added atomically or not) and D alone; and the tile steps the
warp-specialized backward (`backward_specialized`) shares with them."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from cs336_systems.kernels.flash_gluon.common import (
    LOG2_E_GL, _fill_ring, _key_tiles, _mask_walked, _next_slot, _own_pair, _query_tile,
    _rest_rings, _ring_pair, _row_dots, _shared_tile, _store_split, _tma_add, _wgmma_layouts,
    head_split,
)


# --- backward (FlashAttention-2, Algorithm 2): dK and dV from key tiles, dQ from query tiles --
# Both recompute the probabilities from the forward's logsumexp (read in natural log, used in
# base 2 as the scores are) and take D = rowsum(dO * O) (`delta`): the dQ kernel, launched
# first, computes each of its rows' D and stores it for the key-tile kernel. In the atomic
# schedule a small kernel computes D, and the key-tile kernel adds dQ as it goes.


@gluon.jit
def _key_tile_masked(start_n, start_m, seq, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     CAUSAL: gl.constexpr, KEYS_BOUNDED: gl.constexpr):
    """Whether the key-tile kernels' tile of BLOCK_N keys from start_n by BLOCK_M queries from
    start_m needs a mask: the sequence's last query tile, the diagonal band under the causal
    mask and, with KEYS_BOUNDED (dQ added here), keys past the end, whose dS would reach other
    rows' dQ."""
    masked = start_m + BLOCK_M > seq
    if KEYS_BOUNDED:
        masked = masked | (start_n + BLOCK_N > seq)
    if CAUSAL:
        masked = masked | (start_m < start_n + BLOCK_N)
    return masked


@gluon.jit
def _probabilities_t(st, lse2, start_n, start_m, seq, qk_scale, masked, layout: gl.constexpr,
                     KEYS: gl.constexpr, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr,
                     KEYS_BOUNDED: gl.constexpr):
    """P^T = exp2(S^T * scale - lse) for KEYS keys from start_n by BLOCK_M queries from start_m,
    from the forward's logsumexp in base 2 (`lse2`, a query each), zero where `masked` says the
    tile crosses the causal diagonal or the sequence's end (`_key_tile_masked`)."""
    pt = gl.exp2(st * qk_scale - lse2[None, :])
    if masked:
        pt = _mask_walked(pt, start_n, start_m, seq, 0.0, layout, KEYS, BLOCK_M, False, CAUSAL,
                          KEYS_BOUNDED)
    return pt


@gluon.jit
def _dkdv_tile(k_smem, v_smem, q_tile, do_tile, ds_smem, dq_smem, dk, dv, dq_desc, lse_ptr,
               delta_ptr, head_row, start_n, start_m, seq, qk_scale, sm_scale, masked,
               st_layout: gl.constexpr, acc_layout: gl.constexpr, op_layout: gl.constexpr,
               HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               CAUSAL: gl.constexpr, ATOMIC_DQ: gl.constexpr, REST: gl.constexpr, k_tail, v_tail,
               q_tail, do_tail, dk_rest, dv_rest, r_layout: gl.constexpr,
               rop_layout: gl.constexpr):
    """One query tile's share of a key tile's dK and dV, transposed (keys are rows): S^T = K Q^T,
    P^T, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q (lines 11-16).
    With ATOMIC_DQ, dS^T goes through shared memory (`ds_smem`), where it is dK's A operand and,
    read transposed, dQ's: the tile's share of dQ = dS K (line 15) goes through `dq_smem` (one of
    two buffers, taken in turn) and is added to dQ's fp32 rows by one TMA reduction (rows past
    the head's end add zeros: their dS is masked). `masked`: the tile crosses the causal
    diagonal or the sequence's end. With REST (not with ATOMIC_DQ), the head dim's rest columns
    (`head_split`: the *_tail tiles) add their share to S^T and dP^T and have dK's and dV's rest
    columns of their own (dk_rest, dv_rest, in `r_layout`; returned as dk and dv again without
    them)."""
    rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(0, st_layout))   # queries
    lse2 = gl.load(lse_ptr + head_row + rows, mask=rows < seq, other=0.0) * LOG2_E_GL
    delta = gl.load(delta_ptr + head_row + rows, mask=rows < seq, other=0.0)
    zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    st = warpgroup_mma(k_smem, q_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    if REST:
        st = warpgroup_mma(k_tail, q_tail.permute((1, 0)), st, is_async=True)
    dpt = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    if REST:
        dpt = warpgroup_mma(v_tail, do_tail.permute((1, 0)), dpt, is_async=True)
    st, dpt = warpgroup_mma_wait(num_outstanding=0, deps=(st, dpt))
    pt = _probabilities_t(st, lse2, start_n, start_m, seq, qk_scale, masked, st_layout, BLOCK_N,
                          BLOCK_M, CAUSAL, ATOMIC_DQ)
    dst = pt * (dpt - delta[None, :])
    pt16 = gl.convert_layout(pt.to(q_tile.dtype), op_layout)
    if ATOMIC_DQ:
        ds_smem.store(dst.to(q_tile.dtype))
        fence_async_shared()
        # dQ's product first, so that its atomic adds overlap dV's and dK's products
        dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem,
                           gl.zeros([BLOCK_M, HEAD_D], gl.float32, acc_layout), use_acc=False,
                           is_async=True)
        dv = warpgroup_mma(pt16, do_tile, dv, is_async=True)
        dk = warpgroup_mma(ds_smem, q_tile, dk, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=2, deps=(dq,))
        tma.store_wait(1)               # the reduction of two tiles ago has read this buffer
        dq_smem.store(dq * sm_scale)
        fence_async_shared()
        _tma_add(dq_desc, [head_row + start_m, 0], dq_smem)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
    elif REST:
        dst16 = gl.convert_layout(dst.to(q_tile.dtype), op_layout)
        dv = warpgroup_mma(pt16, do_tile, dv, is_async=True)
        dv_rest = warpgroup_mma(gl.convert_layout(pt16, rop_layout), do_tail, dv_rest,
                                is_async=True)
        dk = warpgroup_mma(dst16, q_tile, dk, is_async=True)
        dk_rest = warpgroup_mma(gl.convert_layout(dst16, rop_layout), q_tail, dk_rest,
                                is_async=True)
        dv, dv_rest, dk, dk_rest = warpgroup_mma_wait(num_outstanding=0,
                                                      deps=(dv, dv_rest, dk, dk_rest))
    else:
        dst16 = gl.convert_layout(dst.to(q_tile.dtype), op_layout)
        dv = warpgroup_mma(pt16, do_tile, dv, is_async=True)
        dk = warpgroup_mma(dst16, q_tile, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
    if not REST:
        dk_rest = dk
        dv_rest = dv
    return dk, dv, dk_rest, dv_rest


@gluon.jit
def attention_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, q_rest, k_rest, v_rest, do_rest,
                          dq_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr, seq, qk_scale, sm_scale,
                          HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, CAUSAL: gl.constexpr, ATOMIC_DQ: gl.constexpr,
                          num_warps: gl.constexpr):
    """*_rest: the TMA descriptors of the head dim's rest columns where it has them
    (`head_split`; not with ATOMIC_DQ), else None."""
    pid_n = gl.program_id(0)            # which BLOCK_N keys
    bh = gl.program_id(1)               # which (batch, head)
    head_row = bh * seq
    start_n = pid_n * BLOCK_N
    split: gl.constexpr = head_split(HEAD_D)
    MAIN_D: gl.constexpr = split[0]           # the head dim's columns in two parts
    REST_D: gl.constexpr = split[1]
    REST: gl.constexpr = REST_D > 0
    gl.static_assert(not (REST and ATOMIC_DQ), "the atomic backward takes d 64")

    layouts: gl.constexpr = _wgmma_layouts(BLOCK_M, HEAD_D, num_warps)  # keys are the rows
    st_layout: gl.constexpr = layouts[0]
    acc_layout: gl.constexpr = layouts[1]
    op_layout: gl.constexpr = layouts[2]
    r_layout: gl.constexpr = layouts[3]      # the rest columns' accumulators
    rop_layout: gl.constexpr = layouts[4]    # and their products' A operands

    k_smem, v_smem, k_tail, v_tail, kv_ready = _own_pair(k_desc, v_desc, head_row + start_n,
                                                         k_rest, v_rest)
    q_smem, do_smem, ready = _ring_pair(q_desc, do_desc, STAGES)
    q_tail, do_tail = _rest_rings(q_rest, do_rest, q_smem, do_smem, STAGES)
    # with ATOMIC_DQ: dS^T a tile at a time (dK's A operand and, transposed, dQ's), and two
    # buffers of a tile's fp32 share of dQ, which the TMA reductions read
    if ATOMIC_DQ:
        ds_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_N, BLOCK_M],
                                            _shared_tile(BLOCK_N, BLOCK_M, q_desc.dtype))
        dq_smem = gl.allocate_shared_memory(dq_desc.dtype, [2] + dq_desc.block_type.shape,
                                            dq_desc.layout)
    else:           # dS^T stays in registers; no dQ here (dq_desc is unused)
        ds_smem = k_smem
        dq_smem = k_smem

    # the query tiles that see these keys: from the first query at or after the first key
    first = 0
    if CAUSAL:
        first = start_n // BLOCK_M
    n_tiles = gl.cdiv(seq, BLOCK_M) - first
    _fill_ring(q_desc, do_desc, q_smem, do_smem, ready, head_row + first * BLOCK_M, n_tiles,
               BLOCK_M, STAGES, q_rest, do_rest, q_tail, do_tail)
    dk = gl.zeros([BLOCK_N, MAIN_D], gl.float32, acc_layout)
    dv = gl.zeros([BLOCK_N, MAIN_D], gl.float32, acc_layout)
    dk_rest = dk
    dv_rest = dv
    if REST:
        dk_rest = gl.zeros([BLOCK_N, REST_D], gl.float32, r_layout)
        dv_rest = gl.zeros([BLOCK_N, REST_D], gl.float32, r_layout)
    mbarrier.wait(kv_ready, 0)

    for j in range(n_tiles):
        slot = _next_slot(q_desc, do_desc, q_smem, do_smem, ready, head_row + first * BLOCK_M, j,
                          n_tiles, BLOCK_M, STAGES, q_rest, do_rest, q_tail, do_tail)
        start_m = (first + j) * BLOCK_M
        needs_mask = _key_tile_masked(start_n, start_m, seq, BLOCK_M, BLOCK_N, CAUSAL, ATOMIC_DQ)
        dq_buffer = dq_smem
        if ATOMIC_DQ:
            dq_buffer = dq_smem.index(j % 2)
        dk, dv, dk_rest, dv_rest = _dkdv_tile(
            k_smem, v_smem, q_smem.index(slot), do_smem.index(slot), ds_smem, dq_buffer, dk, dv,
            dq_desc, lse_ptr, delta_ptr, head_row, start_n, start_m, seq, qk_scale, sm_scale,
            needs_mask, st_layout, acc_layout, op_layout, MAIN_D, BLOCK_M, BLOCK_N, CAUSAL,
            ATOMIC_DQ, REST, k_tail, v_tail, q_tail.index(slot), do_tail.index(slot), dk_rest,
            dv_rest, r_layout, rop_layout)

    if ATOMIC_DQ:
        tma.store_wait(0)               # the last reduction has read dq_smem
    mbarrier.invalidate(kv_ready)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    _store_split(dk_ptr, dk * sm_scale, dk_rest * sm_scale, head_row, start_n, seq, acc_layout,
                 r_layout, HEAD_D, BLOCK_N, REST)
    _store_split(dv_ptr, dv, dv_rest, head_row, start_n, seq, acc_layout, r_layout, HEAD_D,
                 BLOCK_N, REST)


@gluon.jit
def _dq_tile(q_smem, do_smem, k_tile, v_tile, dq, lse2, delta, start_m, start_n, seq, qk_scale,
             masked, s_layout: gl.constexpr, op_layout: gl.constexpr, BLOCK_M: gl.constexpr,
             BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, REST: gl.constexpr, q_tail, do_tail,
             k_tail, v_tail, dq_rest, rop_layout: gl.constexpr):
    """One key tile's share of a query tile's dQ: S = Q K^T, P, dP = dO V^T, dS = P (dP - D),
    dQ += dS K (lines 11-15). `masked`: as in `_dkdv_tile`. With REST, the head dim's rest
    columns (the *_tail tiles) add their share to S and dP and have dQ's rest columns
    (`dq_rest`; returned as dq again without them)."""
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    if REST:
        s = warpgroup_mma(q_tail, k_tail.permute((1, 0)), s, is_async=True)
    dp = warpgroup_mma(do_smem, v_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    if REST:
        dp = warpgroup_mma(do_tail, v_tail.permute((1, 0)), dp, is_async=True)
    s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
    p = gl.exp2(s * qk_scale - lse2[:, None])
    if masked:
        p = _mask_walked(p, start_m, start_n, seq, 0.0, s_layout, BLOCK_M, BLOCK_N, True, CAUSAL)
    ds = gl.convert_layout((p * (dp - delta[:, None])).to(k_tile.dtype), op_layout)
    dq = warpgroup_mma(ds, k_tile, dq, is_async=True)
    if REST:
        dq_rest = warpgroup_mma(gl.convert_layout(ds, rop_layout), k_tail, dq_rest,
                                is_async=True)
        dq, dq_rest = warpgroup_mma_wait(num_outstanding=0, deps=(dq, dq_rest))
    else:
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        dq_rest = dq
    return dq, dq_rest


@gluon.jit
def attention_dq_kernel(q_desc, k_desc, v_desc, do_desc, q_rest, k_rest, v_rest, do_rest,
                        dq_ptr, o_ptr, do_ptr, lse_ptr, delta_ptr, seq, qk_scale, sm_scale,
                        HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """*_rest: the TMA descriptors of the head dim's rest columns where it has them
    (`head_split`), else None."""
    bh, pid_m = _query_tile(seq, HEAD_D, CAUSAL)    # which (batch, head), which BLOCK_M queries
    head_row = bh * seq
    start_m = pid_m * BLOCK_M
    split: gl.constexpr = head_split(HEAD_D)
    MAIN_D: gl.constexpr = split[0]           # the head dim's columns in two parts
    REST_D: gl.constexpr = split[1]
    REST: gl.constexpr = REST_D > 0

    layouts: gl.constexpr = _wgmma_layouts(BLOCK_N, HEAD_D, num_warps)
    s_layout: gl.constexpr = layouts[0]
    acc_layout: gl.constexpr = layouts[1]
    op_layout: gl.constexpr = layouts[2]
    r_layout: gl.constexpr = layouts[3]      # the rest columns' accumulators
    rop_layout: gl.constexpr = layouts[4]    # and their products' A operands

    q_smem, do_smem, q_tail, do_tail, q_ready = _own_pair(q_desc, do_desc, head_row + start_m,
                                                          q_rest, do_rest)
    k_smem, v_smem, ready = _ring_pair(k_desc, v_desc, STAGES)
    k_tail, v_tail = _rest_rings(k_rest, v_rest, k_smem, v_smem, STAGES)

    n_tiles, n_full = _key_tiles(start_m, seq, BLOCK_M, BLOCK_N, CAUSAL)
    _fill_ring(k_desc, v_desc, k_smem, v_smem, ready, head_row, n_tiles, BLOCK_N, STAGES,
               k_rest, v_rest, k_tail, v_tail)
    rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, s_layout))
    lse2 = gl.load(lse_ptr + head_row + rows, mask=rows < seq, other=0.0) * LOG2_E_GL
    delta = gl.convert_layout(_row_dots(o_ptr, do_ptr, head_row, start_m, seq, HEAD_D, BLOCK_M,
                                        num_warps)[1], gl.SliceLayout(1, s_layout))
    gl.store(delta_ptr + head_row + rows, delta, mask=rows < seq)   # for the key-tile kernel
    dq = gl.zeros([BLOCK_M, MAIN_D], gl.float32, acc_layout)
    dq_rest = dq
    if REST:
        dq_rest = gl.zeros([BLOCK_M, REST_D], gl.float32, r_layout)
    mbarrier.wait(q_ready, 0)

    for j in range(n_tiles):
        slot = _next_slot(k_desc, v_desc, k_smem, v_smem, ready, head_row, j, n_tiles, BLOCK_N,
                          STAGES, k_rest, v_rest, k_tail, v_tail)
        dq, dq_rest = _dq_tile(q_smem, do_smem, k_smem.index(slot), v_smem.index(slot), dq,
                               lse2, delta, start_m, j * BLOCK_N, seq, qk_scale, j >= n_full,
                               s_layout, op_layout, BLOCK_M, BLOCK_N, CAUSAL, REST, q_tail,
                               do_tail, k_tail.index(slot), v_tail.index(slot), dq_rest,
                               rop_layout)

    mbarrier.invalidate(q_ready)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    _store_split(dq_ptr, dq * sm_scale, dq_rest * sm_scale, head_row, start_m, seq, acc_layout,
                 r_layout, HEAD_D, BLOCK_M, REST)


@gluon.jit
def attention_delta_kernel(o_ptr, do_ptr, delta_ptr, seq, HEAD_D: gl.constexpr,
                           BLOCK: gl.constexpr, num_warps: gl.constexpr):
    """D = rowsum(dO * O) of BLOCK rows of one (batch, head) (Algorithm 2, line 4), for the
    backward whose key-tile kernel adds dQ atomically (no query-tile kernel computes it)."""
    start = gl.program_id(0) * BLOCK    # which BLOCK rows
    head_row = gl.program_id(1) * seq   # of which (batch, head)
    rows, delta = _row_dots(o_ptr, do_ptr, head_row, start, seq, HEAD_D, BLOCK, num_warps)
    gl.store(delta_ptr + head_row + rows, delta, mask=rows < seq)
