"""The backward kernels (Algorithm 2): the query-tile kernel (dQ and D), the key-tile kernel
(dK and dV, with dQ added atomically or not), D alone, and the warp-specialized key-tile kernel
(a loader warp and two consumers, with a dQ warpgroup or each computing half of dQ's columns)."""

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
    CONSUMER_REGISTERS, DQ_REGISTERS, LOADER_REGISTERS, LOADER_WARPS, LOG2_E_GL,
    PINGPONG_REGISTERS, _barrier, _block_rows, _fill_ring, _issue_pair, _key_tiles, _mask_walked,
    _next_slot, _own_pair, _query_tile, _rest_rings, _ring_pair, _row_dots, _shared_tile,
    _store_rows, _store_split, _tma_add, _tma_load, _wgmma_layouts, head_split,
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


# --- backward, warp-specialized (FlashAttention-3's producer and consumers, five products) ----
# A program owns BLOCK_N keys, BLOCK_N // 2 to each of two consumer warpgroups, and walks the
# query tiles that see them; a loader warp issues every TMA load. Each consumer computes its
# keys' S^T and dP^T, then P^T and dS^T, adds P^T dO to dV and dS^T Q to dK from registers, and
# writes its dS^T rows to shared memory. Once both halves are there, a third warpgroup computes
# the tile's dQ = dS K over all BLOCK_N keys and adds it to the fp32 accumulator (in its
# threads' order, `_thread_order`) with one TMA bulk reduction: half the reductions of the
# atomic schedule, whose programs own half the keys, and the consumers never wait for each
# other. Barriers: kv_ready (K and V landed); q_ready and q_empty, a ring slot each (Q and dO
# landed; both consumers done with them); ds_ready and ds_free, a dS^T buffer each (both halves
# written; the dQ warpgroup done with them).


@gluon.jit
def _dkdv_consumer(shared, CONSUMER: gl.constexpr, HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                   DQ_WARPGROUP: gl.constexpr):
    """Consumer CONSUMER (0 or 1): keys start_n + CONSUMER * BLOCK_N // 2 onwards, their dK and
    dV over the walked query tiles (transposed products, as `_dkdv_tile`), and their rows of
    each tile's dS^T, through two buffers in turn: for the dQ warpgroup (DQ_WARPGROUP), or, once
    the other consumer's rows are there too, for this consumer's own half of dQ's columns, dS
    times its half of K's, added to the fp32 accumulator by one TMA reduction (FlashAttention-3's
    schedule at d 128, where a dQ warpgroup leaves the consumers too few registers). Without
    the dQ warpgroup a buffer needs no release: a consumer writes it again two tiles on, past
    the other's arrival at the tile between, which that one makes once its products of this
    tile, dQ's among them, are done. Without it, too, the loader puts each tile's logsumexp and
    D in shared memory beside its Q and dO (`lse_smem`, `delta_smem`), and a consumer reads them
    in its scores' columns once the products that need them are done, so that they hold no
    registers while S^T and dP^T are in flight: at d 128 the consumers have none to spare."""
    (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_ready, q_ready, q_empty, ds_ready,
     ds_free, dq_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr, lse_smem, delta_smem, head_row,
     start_n, first, n_tiles, seq, qk_scale, sm_scale) = shared   # the kernel's `shared`
    KEYS: gl.constexpr = BLOCK_N // 2
    layouts: gl.constexpr = _wgmma_layouts(BLOCK_M, HEAD_D, 4)     # the consumer's keys by...
    st_layout: gl.constexpr = layouts[0]                            # ...the walked queries
    acc_layout: gl.constexpr = layouts[1]                           # ...d (dK, dV)
    op_layout: gl.constexpr = layouts[2]                            # P^T, dS^T as A operands
    dtype: gl.constexpr = q_smem.dtype
    my_k = k_smem.slice(CONSUMER * KEYS, KEYS)
    my_v = v_smem.slice(CONSUMER * KEYS, KEYS)
    my_start = start_n + CONSUMER * KEYS
    zero = gl.zeros([KEYS, BLOCK_M], gl.float32, st_layout)
    dk = gl.zeros([KEYS, HEAD_D], gl.float32, acc_layout)
    dv = gl.zeros([KEYS, HEAD_D], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)

    for j in range(n_tiles):
        slot = j % STAGES
        buf = j % 2
        start_m = (first + j) * BLOCK_M
        needs_mask = _key_tile_masked(start_n, start_m, seq, BLOCK_M, BLOCK_N, CAUSAL, True)
        rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(0, st_layout))   # queries
        q_tile = q_smem.index(slot)
        do_tile = do_smem.index(slot)
        mbarrier.wait(q_ready.index(slot), (j // STAGES) & 1)
        st = warpgroup_mma(my_k, q_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(my_v, do_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
        if DQ_WARPGROUP:
            lse2 = gl.load(lse_ptr + head_row + rows, mask=rows < seq, other=0.0) * LOG2_E_GL
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        else:
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
            lse2 = lse_smem.index(slot).load(gl.SliceLayout(0, st_layout)) * LOG2_E_GL
        pt = _probabilities_t(st, lse2, my_start, start_m, seq, qk_scale, needs_mask, st_layout,
                              KEYS, BLOCK_M, CAUSAL, True)
        if DQ_WARPGROUP:
            delta = gl.load(delta_ptr + head_row + rows, mask=rows < seq, other=0.0)
            dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
        else:
            dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
            delta = delta_smem.index(slot).load(gl.SliceLayout(0, st_layout))
        dst = (pt * (dpt - delta[None, :])).to(dtype)
        dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do_tile, dv,
                           is_async=True)
        dk = warpgroup_mma(gl.convert_layout(dst, op_layout), q_tile, dk, is_async=True)
        # this consumer's dS^T rows into the tile's buffer, once the dQ warpgroup has read the
        # buffer's last tile (two tiles ago); the dQ warpgroup takes it from there
        if DQ_WARPGROUP:
            mbarrier.wait(ds_free.index(buf), ((j // 2) & 1) ^ 1)
        ds_smem.index(buf).slice(CONSUMER * KEYS, KEYS).store(dst)
        fence_async_shared()
        _barrier()                      # every thread's rows written before the one arrive
        mbarrier.arrive(ds_ready.index(buf), count=1)
        if not DQ_WARPGROUP:
            _dq_half(k_smem, ds_smem.index(buf), dq_smem, ds_ready.index(buf), dq_desc,
                     _dq_block(seq, first + j, BLOCK_M), (j // 2) & 1, sm_scale, CONSUMER,
                     HEAD_D, BLOCK_M)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(q_empty.index(slot), count=1)

    if not DQ_WARPGROUP:
        tma.store_wait(0)               # the last reduction has read this consumer's buffer
    _store_rows(dk_ptr, dk * sm_scale, head_row, my_start, seq, acc_layout, HEAD_D, KEYS)
    _store_rows(dv_ptr, dv, head_row, my_start, seq, acc_layout, HEAD_D, KEYS)


@gluon.jit
def _thread_order(acc, BLOCK_M: gl.constexpr, COLS: gl.constexpr):
    """A (BLOCK_M = 64, COLS) wgmma accumulator of one warpgroup as `_block_rows` rows of 32 in
    its threads' order: warp w's 16 rows, then column group j of 8, lane, the lane's four values
    (rows w*16 + h*8 + lane/4, columns j*8 + 2*(lane%4) + e, for h and e of 0 and 1). A warp so
    stores each column group's values as 512 contiguous bytes, 16 a lane, without a bank
    conflict, where the rows of a TMA tile (swizzled or not) took two to four times the shared
    memory's wavefronts (FlashAttention-3 keeps its dQ accumulator in this order too);
    `unpermute_dq` puts them back in rows."""
    gl.static_assert(BLOCK_M == 64, "a warpgroup's accumulator: four warps of 16 rows")
    x = acc.reshape([4, 2, 8, COLS // 8, 4, 2])            # w, h, lane/4, j, lane%4, e
    return x.permute((0, 3, 2, 4, 1, 5)).reshape([_block_rows(BLOCK_M, COLS), 32])


@gluon.jit
def _dq_block(seq, tile, BLOCK_M: gl.constexpr):
    """The block of the fp32 dQ accumulator that query tile `tile` of the program's (batch,
    head) adds to: the heads' tiles in order, cdiv(seq, BLOCK_M) a head (the key-tile kernels'
    grids are (key tiles, heads))."""
    return gl.program_id(1) * gl.cdiv(seq, BLOCK_M) + tile


@gluon.jit
def _dq_half(k_smem, ds_tile, dq_smem, ds_ready, dq_desc, block, phase, sm_scale,
             CONSUMER: gl.constexpr, HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr):
    """A consumer's half of a tile's dQ columns: once both consumers' dS^T rows are in
    `ds_tile`, dS K over all the program's keys and this consumer's HEAD_D // 2 columns of K,
    added to the tile's `block` of the fp32 accumulator, this consumer's half of it, by one TMA
    reduction from the consumer's own buffer (`_thread_order`)."""
    HALF: gl.constexpr = HEAD_D // 2
    acc_layout: gl.constexpr = _wgmma_layouts(BLOCK_M, HALF, 4)[1]
    mbarrier.wait(ds_ready, phase)
    dq = warpgroup_mma(ds_tile.permute((1, 0)), k_smem.slice(CONSUMER * HALF, HALF, dim=1),
                       gl.zeros([BLOCK_M, HALF], gl.float32, acc_layout), use_acc=False,
                       is_async=True)
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
    my_dq = dq_smem.index(CONSUMER)
    tma.store_wait(0)                   # this consumer's last reduction has read its buffer
    my_dq.store(_thread_order(dq * sm_scale, BLOCK_M, HALF))
    fence_async_shared()
    _barrier()
    _tma_add(dq_desc, [(block * 2 + CONSUMER) * _block_rows(BLOCK_M, HALF), 0], my_dq)


@gluon.jit
def _dq_partition(k_smem, ds_smem, dq_smem, kv_ready, ds_ready, ds_free, dq_desc, seq,
                  first, n_tiles, sm_scale, HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr):
    """The dQ warpgroup: each walked tile's dQ = dS K over all the program's keys, once both
    consumers have written their dS^T rows, added to the tile's block of the fp32 accumulator
    (`_thread_order`) by one TMA reduction from one of two buffers, taken in turn."""
    acc_layout: gl.constexpr = _wgmma_layouts(BLOCK_M, HEAD_D, 4)[1]
    mbarrier.wait(kv_ready, 0)
    for j in range(n_tiles):
        buf = j % 2
        mbarrier.wait(ds_ready.index(buf), (j // 2) & 1)
        dq = warpgroup_mma(ds_smem.index(buf).permute((1, 0)), k_smem,
                           gl.zeros([BLOCK_M, HEAD_D], gl.float32, acc_layout), use_acc=False,
                           is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        mbarrier.arrive(ds_free.index(buf), count=1)
        tma.store_wait(1)               # the reduction of two tiles ago has read this buffer
        dq_smem.index(buf).store(_thread_order(dq * sm_scale, BLOCK_M, HEAD_D))
        fence_async_shared()
        _barrier()
        _tma_add(dq_desc, [_dq_block(seq, first + j, BLOCK_M) * _block_rows(BLOCK_M, HEAD_D), 0],
                 dq_smem.index(buf))
    tma.store_wait(0)


@gluon.jit
def _dkdv_load_partition(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem,
                         kv_ready, q_ready, q_empty, head_row, start_n, first, n_tiles,
                         BLOCK_M: gl.constexpr, STAGES: gl.constexpr, lse_ptr=None,
                         delta_ptr=None, lse_smem=None, delta_smem=None, seq=None):
    """The producer: the program's K and V, then each walked query tile's Q and dO into its
    ring slot once both consumers have released the slot's previous tile; where it is given
    `lse_smem` (the paired consumers), also the tile's logsumexp and D into theirs, loaded
    here and stored, the slot's second arrival. The consumers then read them in the layout
    they need from shared memory, without a load's latency or a conversion of their own."""
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [head_row + start_n, 0], kv_ready, k_smem)
    _tma_load(v_desc, [head_row + start_n, 0], kv_ready, v_smem)
    for j in range(n_tiles):
        slot = j % STAGES
        row = head_row + (first + j) * BLOCK_M
        mbarrier.wait(q_empty.index(slot), ((j // STAGES) & 1) ^ 1)
        _issue_pair(q_desc, do_desc, q_smem, do_smem, q_ready, row, j, STAGES)
        if lse_smem is not None:
            # (a constexpr passed through warp_specialize arrives as a value: the tile's rows
            # from the descriptor's block)
            TILE: gl.constexpr = q_desc.block_type.shape[0]
            one_warp: gl.constexpr = gl.BlockedLayout([TILE // 32], [32], [1], [0])
            rows = (first + j) * TILE + gl.arange(0, TILE, one_warp)
            lse_smem.index(slot).store(gl.load(lse_ptr + head_row + rows, mask=rows < seq,
                                               other=0.0))
            delta_smem.index(slot).store(gl.load(delta_ptr + head_row + rows, mask=rows < seq,
                                                 other=0.0))
            _barrier()                  # the warp's stores made before its one arrival
            mbarrier.arrive(q_ready.index(slot), count=1)


@gluon.jit
def attention_dkdv_specialized_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, dk_ptr, dv_ptr,
                                      lse_ptr, delta_ptr, seq, qk_scale, sm_scale,
                                      HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr,
                                      BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                      CAUSAL: gl.constexpr, DQ_WARPGROUP: gl.constexpr,
                                      num_warps: gl.constexpr):
    gl.static_assert(num_warps == 4, "each consumer is one warpgroup")
    pid_n = gl.program_id(0)            # which BLOCK_N keys
    bh = gl.program_id(1)               # which (batch, head)
    head_row = bh * seq
    start_n = pid_n * BLOCK_N
    first = 0                           # the query tiles that see these keys
    if CAUSAL:
        first = start_n // BLOCK_M
    n_tiles = gl.cdiv(seq, BLOCK_M) - first

    dtype: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    if DQ_WARPGROUP:
        q_smem, do_smem, q_ready = _ring_pair(q_desc, do_desc, STAGES)
    else:       # the paired consumers' logsumexp and D arrive beside Q and dO
        q_smem, do_smem, q_ready = _ring_pair(q_desc, do_desc, STAGES, 2)
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(q_empty.index(i), count=2)    # both consumers release each tile
    ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M],
                                        _shared_tile(BLOCK_N, BLOCK_M, dtype))
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)   # both consumers write their halves
        mbarrier.init(ds_free.index(i), count=1)    # the dQ warpgroup has read them
    # two buffers of a tile's fp32 dQ (a tile's, or a consumer's half of its columns), which
    # the TMA reductions read
    dq_smem = gl.allocate_shared_memory(dq_desc.dtype, [2] + dq_desc.block_type.shape,
                                        dq_desc.layout)
    # the paired consumers' logsumexp and D, a walked tile's in the ring slot of its Q and dO
    # (the loader's; with the dQ warpgroup the consumers load them, and these are not read)
    lse_smem = dq_smem
    delta_smem = dq_smem
    if not DQ_WARPGROUP:
        vectors: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vectors)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vectors)

    # what both consumers take (a partition is written out in each call: a kernel's variables
    # hold values and tuples of them, not functions)
    shared = (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_ready, q_ready, q_empty,
              ds_ready, ds_free, dq_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr, lse_smem, delta_smem,
              head_row, start_n, first, n_tiles, seq, qk_scale, sm_scale)
    loads = (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_ready, q_ready,
             q_empty, head_row, start_n, first, n_tiles, BLOCK_M, STAGES)
    if DQ_WARPGROUP:
        gl.warp_specialize([
            (_dkdv_consumer, (shared, 0, HEAD_D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, True)),
            (_dkdv_consumer, (shared, 1, HEAD_D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, True)),
            (_dkdv_load_partition, loads),
            (_dq_partition, (k_smem, ds_smem, dq_smem, kv_ready, ds_ready, ds_free, dq_desc,
                             seq, first, n_tiles, sm_scale, HEAD_D, BLOCK_M)),
        ], [num_warps, LOADER_WARPS, 4], [CONSUMER_REGISTERS, LOADER_REGISTERS, DQ_REGISTERS])
    else:
        gl.warp_specialize([
            (_dkdv_consumer, (shared, 0, HEAD_D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, False)),
            (_dkdv_consumer, (shared, 1, HEAD_D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, False)),
            (_dkdv_load_partition, loads + (lse_ptr, delta_ptr, lse_smem, delta_smem, seq)),
        ], [num_warps, LOADER_WARPS], [PINGPONG_REGISTERS, LOADER_REGISTERS])

    mbarrier.invalidate(kv_ready)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(q_empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(ds_ready.index(i))
        mbarrier.invalidate(ds_free.index(i))


# the backward's kernels of KERNELS (the key-tile kernel with dQ added atomically or not)
_BACKWARD_KERNELS = {"dq": attention_dq_kernel, "dkdv": attention_dkdv_kernel,
                     "dkdv-atomic": attention_dkdv_kernel,
                     "dkdv-specialized": attention_dkdv_specialized_kernel,
                     "dkdv-paired": attention_dkdv_specialized_kernel,
                     "delta": attention_delta_kernel}
