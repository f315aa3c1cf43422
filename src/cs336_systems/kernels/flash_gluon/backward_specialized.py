"""The warp-specialized backward's key-tile kernel (FlashAttention-3's producer and consumers):
a loader warp and two consumer warpgroups, with a dQ warpgroup (`specialized`) or each consumer
computing half of dQ's columns (`paired`), dQ added to an fp32 accumulator in the warpgroups'
thread order."""

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

from cs336_systems.kernels.flash_gluon.backward import _key_tile_masked, _probabilities_t
from cs336_systems.kernels.flash_gluon.common import (
    CONSUMER_REGISTERS, DQ_REGISTERS, LOADER_REGISTERS, LOADER_WARPS, LOG2_E_GL,
    PINGPONG_REGISTERS, _barrier, _block_rows, _issue_pair, _ring_pair, _shared_tile, _store_rows,
    _tma_add, _tma_load, _wgmma_layouts,
)


# --- backward, warp-specialized (FlashAttention-3's producer and consumers, five products) ----
# A program owns BLOCK_N keys, BLOCK_N // 2 to each of two consumer warpgroups, and walks the
# query tiles that see them; a loader warp issues every TMA load. Each consumer computes its
# keys' S^T and dP^T, then P^T and dS^T, adds P^T dO to dV and dS^T Q to dK from registers, and
# writes its dS^T rows to shared memory. Once both halves are there, a third warpgroup computes
# the tile's dQ = dS K over all BLOCK_N keys and adds it to the fp32 accumulator (in its
# threads' order, `_thread_order`) with one TMA bulk reduction: half the reductions of the
# atomic schedule, whose programs own half the keys, and the consumers never wait for each
# other (`specialized`). Or each consumer computes and adds half of dQ's columns itself, one
# tile late (`paired`, `_paired_consumer`). Barriers: kv_ready (K and V landed); q_ready and
# q_empty, a ring slot each (Q and dO landed; both consumers done with them); ds_ready and
# ds_free, a dS^T buffer each (both halves written; the dQ warpgroup done with them).


@gluon.jit
def _issue_scores_t(my_k, my_v, q_tile, do_tile, zero):
    """A consumer's S^T = K Q^T and dP^T = V dO^T for one walked tile, issued in that order."""
    st = warpgroup_mma(my_k, q_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    dpt = warpgroup_mma(my_v, do_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    return st, dpt


@gluon.jit
def _tile_gradients(st, dpt, q_tile, do_tile, dk, dv, lse_ptr, delta_ptr, lse_vec, delta_vec,
                    head_row, start_n, my_start, start_m, seq, qk_scale, st_layout: gl.constexpr,
                    op_layout: gl.constexpr, KEYS: gl.constexpr, BLOCK_M: gl.constexpr,
                    CAUSAL: gl.constexpr, STATS_IN_SMEM: gl.constexpr):
    """A consumer's share of one walked tile, its S^T and dP^T issued last (`_issue_scores_t`):
    P^T once S^T is done, dS^T = P^T (dP^T - D) once dP^T is, then dV += P^T dO and dK += dS^T Q
    issued from registers (not waited for). The logsumexp and D come from global memory, loaded
    under the products, or with STATS_IN_SMEM from the ring slot's vectors (`lse_vec`,
    `delta_vec`), read once the products that need them are done. start_n: the program's
    first key; my_start: this consumer's. Returns (dv, dk, dS^T)."""
    dtype: gl.constexpr = q_tile.dtype
    # the program's tile (both consumers' keys) crosses the diagonal or the sequence's end;
    # worked out here, under the products, rather than before they are issued (the paired
    # backward took 0.98x its time so, and 1.00x with these before the wait for Q and dO)
    needs_mask = _key_tile_masked(start_n, start_m, seq, BLOCK_M, 2 * KEYS, CAUSAL, True)
    rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(0, st_layout))   # queries
    if STATS_IN_SMEM:
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        lse2 = lse_vec.load(gl.SliceLayout(0, st_layout)) * LOG2_E_GL
    else:
        lse2 = gl.load(lse_ptr + head_row + rows, mask=rows < seq, other=0.0) * LOG2_E_GL
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
    pt = _probabilities_t(st, lse2, my_start, start_m, seq, qk_scale, needs_mask, st_layout,
                          KEYS, BLOCK_M, CAUSAL, True)
    if STATS_IN_SMEM:
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
        delta = delta_vec.load(gl.SliceLayout(0, st_layout))
    else:
        delta = gl.load(delta_ptr + head_row + rows, mask=rows < seq, other=0.0)
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
    dst = (pt * (dpt - delta[None, :])).to(dtype)
    dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do_tile, dv, is_async=True)
    dk = warpgroup_mma(gl.convert_layout(dst, op_layout), q_tile, dk, is_async=True)
    return dv, dk, dst


@gluon.jit
def _write_ds_t(ds_tile, dst, ds_ready, CONSUMER: gl.constexpr, KEYS: gl.constexpr):
    """This consumer's dS^T rows into a tile's shared buffer, then its one arrival."""
    ds_tile.slice(CONSUMER * KEYS, KEYS).store(dst)
    fence_async_shared()
    _barrier()                          # every thread's rows written before the one arrive
    mbarrier.arrive(ds_ready, count=1)


@gluon.jit
def _consumer_start(k_smem, v_smem, kv_ready, start_n, CONSUMER: gl.constexpr,
                    KEYS: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_D: gl.constexpr,
                    st_layout: gl.constexpr, acc_layout: gl.constexpr):
    """What a consumer starts from: its KEYS rows of K and V and its first key, the zero its
    S^T and dP^T start from, and dK and dV at zero, once K and V have landed."""
    my_k = k_smem.slice(CONSUMER * KEYS, KEYS)
    my_v = v_smem.slice(CONSUMER * KEYS, KEYS)
    my_start = start_n + CONSUMER * KEYS
    zero = gl.zeros([KEYS, BLOCK_M], gl.float32, st_layout)
    dk = gl.zeros([KEYS, HEAD_D], gl.float32, acc_layout)
    dv = gl.zeros([KEYS, HEAD_D], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    return my_k, my_v, my_start, zero, dk, dv


@gluon.jit
def _dkdv_consumer(shared, CONSUMER: gl.constexpr, HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Consumer CONSUMER (0 or 1) beside the dQ warpgroup (`specialized`): keys start_n +
    CONSUMER * BLOCK_N // 2 onwards, their dK and dV over the walked query tiles (transposed
    products, as `_dkdv_tile`), and their rows of each tile's dS^T for the dQ warpgroup,
    through two buffers in turn, each written once the dQ warpgroup has read its last tile."""
    (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_ready, q_ready, q_empty, ds_ready,
     ds_free, dq_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr, lse_smem, delta_smem, head_row,
     start_n, first, n_tiles, seq, qk_scale, sm_scale) = shared   # the kernel's `shared`
    KEYS: gl.constexpr = BLOCK_N // 2
    layouts: gl.constexpr = _wgmma_layouts(BLOCK_M, HEAD_D, 4)     # the consumer's keys by...
    st_layout: gl.constexpr = layouts[0]                            # ...the walked queries
    acc_layout: gl.constexpr = layouts[1]                           # ...d (dK, dV)
    op_layout: gl.constexpr = layouts[2]                            # P^T, dS^T as A operands
    my_k, my_v, my_start, zero, dk, dv = _consumer_start(
        k_smem, v_smem, kv_ready, start_n, CONSUMER, KEYS, BLOCK_M, HEAD_D, st_layout, acc_layout)

    for j in range(n_tiles):
        slot = j % STAGES
        buf = j % 2
        q_tile = q_smem.index(slot)
        do_tile = do_smem.index(slot)
        mbarrier.wait(q_ready.index(slot), (j // STAGES) & 1)
        st, dpt = _issue_scores_t(my_k, my_v, q_tile, do_tile, zero)
        dv, dk, dst = _tile_gradients(st, dpt, q_tile, do_tile, dk, dv, lse_ptr, delta_ptr,
                                      None, None, head_row, start_n, my_start,
                                      (first + j) * BLOCK_M, seq, qk_scale, st_layout,
                                      op_layout, KEYS, BLOCK_M, CAUSAL, False)
        mbarrier.wait(ds_free.index(buf), ((j // 2) & 1) ^ 1)
        _write_ds_t(ds_smem.index(buf), dst, ds_ready.index(buf), CONSUMER, KEYS)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(q_empty.index(slot), count=1)

    _store_rows(dk_ptr, dk * sm_scale, head_row, my_start, seq, acc_layout, HEAD_D, KEYS)
    _store_rows(dv_ptr, dv, head_row, my_start, seq, acc_layout, HEAD_D, KEYS)


@gluon.jit
def _paired_consumer(shared, CONSUMER: gl.constexpr, HEAD_D: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr):
    """Consumer CONSUMER (0 or 1) of the paired schedule (FlashAttention-3's at d 128, where a
    dQ warpgroup leaves the consumers too few registers): its keys' dK and dV as
    `_dkdv_consumer`'s, and its half of each tile's dQ columns, dS K over all the program's
    keys once both consumers' dS^T rows are in the tile's buffer, added to the fp32
    accumulator by one TMA reduction (`_dq_store`). A tile's dQ is issued one tile late, with
    the next tile's S^T, and stored while S^T runs: by then the other consumer's rows are
    almost always there, so the consumers seldom wait for each other, and the tensor cores have
    work while dQ goes out (0.98x the backward's time at 16 x 4096 to 16384 x 128 on an H200,
    where dQ waited for both halves and was stored with nothing in flight; docs/measurements.md).
    A buffer needs no release: a consumer writes it again two tiles on, past the other's
    arrival at the tile between, which that one makes once its dQ of this tile is done. The loader puts each tile's logsumexp and D in shared memory beside
    its Q and dO (`lse_smem`, `delta_smem`), read once the products that need them are done,
    so that they hold no registers while S^T and dP^T are in flight."""
    (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_ready, q_ready, q_empty, ds_ready,
     ds_free, dq_desc, dk_ptr, dv_ptr, lse_ptr, delta_ptr, lse_smem, delta_smem, head_row,
     start_n, first, n_tiles, seq, qk_scale, sm_scale) = shared   # the kernel's `shared`
    KEYS: gl.constexpr = BLOCK_N // 2
    layouts: gl.constexpr = _wgmma_layouts(BLOCK_M, HEAD_D, 4)
    st_layout: gl.constexpr = layouts[0]
    acc_layout: gl.constexpr = layouts[1]
    op_layout: gl.constexpr = layouts[2]
    my_k, my_v, my_start, zero, dk, dv = _consumer_start(
        k_smem, v_smem, kv_ready, start_n, CONSUMER, KEYS, BLOCK_M, HEAD_D, st_layout, acc_layout)

    # the first tile: no dQ before it
    mbarrier.wait(q_ready.index(0), 0)
    st, dpt = _issue_scores_t(my_k, my_v, q_smem.index(0), do_smem.index(0), zero)
    dv, dk, dst = _tile_gradients(st, dpt, q_smem.index(0), do_smem.index(0), dk, dv, lse_ptr,
                                  delta_ptr, lse_smem.index(0), delta_smem.index(0), head_row,
                                  start_n, my_start, first * BLOCK_M, seq, qk_scale, st_layout,
                                  op_layout, KEYS, BLOCK_M, CAUSAL, True)
    _write_ds_t(ds_smem.index(0), dst, ds_ready.index(0), CONSUMER, KEYS)
    dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
    mbarrier.arrive(q_empty.index(0), count=1)
    # tiles 1 ..: the last tile's dQ and this tile's S^T issued, the last tile's dQ stored while
    # S^T runs, then this tile's dP^T and the rest (every product waited for within its tile:
    # ptxas serializes the wgmmas of a loop whose products stay in flight across iterations)
    for j in range(1, n_tiles):
        slot = j % STAGES
        q_tile = q_smem.index(slot)
        do_tile = do_smem.index(slot)
        mbarrier.wait(q_ready.index(slot), (j // STAGES) & 1)
        dq = _dq_product(k_smem, ds_smem.index((j - 1) % 2), ds_ready.index((j - 1) % 2),
                         ((j - 1) // 2) & 1, CONSUMER, HEAD_D, BLOCK_M)
        st = warpgroup_mma(my_k, q_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=1, deps=(dq,))
        _dq_store(dq, dq_smem, dq_desc, _dq_block(seq, first + j - 1, BLOCK_M), sm_scale,
                  CONSUMER, HEAD_D, BLOCK_M, (j - 1) % 2)
        dpt = warpgroup_mma(my_v, do_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
        dv, dk, dst = _tile_gradients(st, dpt, q_tile, do_tile, dk, dv, lse_ptr, delta_ptr,
                                      lse_smem.index(slot), delta_smem.index(slot), head_row,
                                      start_n, my_start, (first + j) * BLOCK_M, seq, qk_scale,
                                      st_layout, op_layout, KEYS, BLOCK_M, CAUSAL, True)
        _write_ds_t(ds_smem.index(j % 2), dst, ds_ready.index(j % 2), CONSUMER, KEYS)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(q_empty.index(slot), count=1)
    # the last tile's dQ
    dq = _dq_product(k_smem, ds_smem.index((n_tiles - 1) % 2), ds_ready.index((n_tiles - 1) % 2),
                     ((n_tiles - 1) // 2) & 1, CONSUMER, HEAD_D, BLOCK_M)
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
    _dq_store(dq, dq_smem, dq_desc, _dq_block(seq, first + n_tiles - 1, BLOCK_M), sm_scale,
              CONSUMER, HEAD_D, BLOCK_M, (n_tiles - 1) % 2)
    tma.store_wait(0)                   # the last reductions have read this consumer's buffers
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
def _dq_product(k_smem, ds_tile, ds_ready, phase, CONSUMER: gl.constexpr, HEAD_D: gl.constexpr,
                BLOCK_M: gl.constexpr):
    """A consumer's half of a tile's dQ columns, issued once both consumers' dS^T rows are in
    `ds_tile`: dS K over all the program's keys and this consumer's HEAD_D // 2 columns of K."""
    HALF: gl.constexpr = HEAD_D // 2
    acc_layout: gl.constexpr = _wgmma_layouts(BLOCK_M, HALF, 4)[1]
    mbarrier.wait(ds_ready, phase)
    return warpgroup_mma(ds_tile.permute((1, 0)), k_smem.slice(CONSUMER * HALF, HALF, dim=1),
                         gl.zeros([BLOCK_M, HALF], gl.float32, acc_layout), use_acc=False,
                         is_async=True)


@gluon.jit
def _dq_store(dq, dq_smem, dq_desc, block, sm_scale, CONSUMER: gl.constexpr,
              HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, parity):
    """A consumer's half of a tile's dQ (`_dq_product`, done), added to the tile's `block` of
    the fp32 accumulator, this consumer's half of it, by one TMA reduction from the consumer's
    buffer of this `parity` (its two, taken in turn, `_thread_order`): the reduction issued a
    tile ago may still be reading the other (0.98x to 0.995x the backward's time at 16 x 4096
    to 32 x 32768 x 128 on an H200, against one buffer waited for each tile;
    docs/measurements.md)."""
    HALF: gl.constexpr = HEAD_D // 2
    my_dq = dq_smem.index(2 * CONSUMER + parity)
    tma.store_wait(1)                   # the reduction of two tiles ago has read this buffer
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
    # the buffers of a tile's fp32 dQ that the TMA reductions read: two of a tile's (the dQ
    # warpgroup's), or two of each consumer's half of its columns (paired; 225 KiB of shared
    # memory in all at d 128)
    DQ_BUFFERS: gl.constexpr = 2 if DQ_WARPGROUP else 4
    dq_smem = gl.allocate_shared_memory(dq_desc.dtype, [DQ_BUFFERS] + dq_desc.block_type.shape,
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
            (_dkdv_consumer, (shared, 0, HEAD_D, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_dkdv_consumer, (shared, 1, HEAD_D, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_dkdv_load_partition, loads),
            (_dq_partition, (k_smem, ds_smem, dq_smem, kv_ready, ds_ready, ds_free, dq_desc,
                             seq, first, n_tiles, sm_scale, HEAD_D, BLOCK_M)),
        ], [num_warps, LOADER_WARPS, 4], [CONSUMER_REGISTERS, LOADER_REGISTERS, DQ_REGISTERS])
    else:
        gl.warp_specialize([
            (_paired_consumer, (shared, 0, HEAD_D, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_paired_consumer, (shared, 1, HEAD_D, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_dkdv_load_partition, loads + (lse_ptr, delta_ptr, lse_smem, delta_smem, seq)),
        ], [num_warps, LOADER_WARPS], [PINGPONG_REGISTERS, LOADER_REGISTERS])

    mbarrier.invalidate(kv_ready)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(q_empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(ds_ready.index(i))
        mbarrier.invalidate(ds_free.index(i))
