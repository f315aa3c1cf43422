"""The forward kernels (Algorithm 1), one a schedule: waited or overlapped (`attention_fwd_kernel`),
warp-specialized (a loader warp and one consumer), and ping-pong (a loader warp and two or three
consumer warpgroups taking turns at the tensor cores)."""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from cs336_systems.kernels.flash_gluon.common import (
    LN_2, LOADER_REGISTERS, LOADER_WARPS, PINGPONG_REGISTERS, _barrier, _fill_ring, _issue_pair,
    _key_tiles, _mask_walked, _next_slot, _own_tile, _query_tile, _rest_rings, _ring_pair,
    _store_split, _tma_load, _tma_store, _wgmma_layouts, head_split,
)


@gluon.jit
def _softmax_step(s, m_i, l_i, start_m, start_n, seq, qk_scale, masked,
                  s_layout: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                  DTYPE: gl.constexpr):
    """The online softmax of one score tile (FA-2, Algorithm 1, lines 8-10), in base 2: P in
    the P V product's operand layout, the factor that rescales O, and the new row max and sum
    (of the scaled scores). The scale goes into the exponent's argument, one FMA a score, as
    FlashAttention-3 does: the row max is taken of the unscaled scores (the scale is positive).
    `masked`: the tile crosses the causal diagonal or the sequence's end."""
    if masked:
        s = _mask_walked(s, start_m, start_n, seq, -float("inf"), s_layout, BLOCK_M, BLOCK_N,
                         True, CAUSAL)
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_new = l_i * alpha + gl.sum(p, axis=1)
    p16 = gl.convert_layout(p.to(DTYPE), p_layout)
    return p16, gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), m_new, l_new


@gluon.jit
def _attend_tile(q_smem, k_tile, v_tile, acc, m_i, l_i, start_m, start_n, seq, qk_scale, masked,
                 s_layout: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                 REST: gl.constexpr = False, q_rest=None, k_rest=None, v_rest=None,
                 acc_rest=None, r_layout: gl.constexpr = None, rop_layout: gl.constexpr = None):
    """One K/V tile, each product waited for: S = Q K^T, the softmax, O = alpha O + P V. With
    REST, the head dim's rest columns (`head_split`) add their share to S and have O's rest
    columns of their own (`acc_rest`, in `r_layout`); returned as acc again without them."""
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    if REST:
        s = warpgroup_mma(q_rest, k_rest.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p16, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, start_m, start_n, seq, qk_scale, masked,
                                         s_layout, p_layout, o_layout, BLOCK_M, BLOCK_N, CAUSAL,
                                         v_tile.dtype)
    acc = warpgroup_mma(p16, v_tile, acc * alpha[:, None], is_async=True)
    if REST:
        alpha_rest = gl.convert_layout(alpha, gl.SliceLayout(1, r_layout))
        acc_rest = warpgroup_mma(gl.convert_layout(p16, rop_layout), v_rest,
                                 acc_rest * alpha_rest[:, None], is_async=True)
        acc, acc_rest = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_rest))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc_rest = acc
    return acc, m_i, l_i, acc_rest


@gluon.jit
def attention_fwd_kernel(q_desc, k_desc, v_desc, q_rest, k_rest, v_rest, o_ptr, lse_ptr, seq,
                         qk_scale, HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                         OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    """q_rest, k_rest, v_rest: the TMA descriptors of the head dim's rest columns where it has
    them (`head_split`; the waited schedule only), else None."""
    bh, pid_m = _query_tile(seq, HEAD_D, CAUSAL)    # which (batch, head), which BLOCK_M queries
    head_row = bh * seq                 # the head's first row in the 2-D views
    start_m = pid_m * BLOCK_M
    split: gl.constexpr = head_split(HEAD_D)
    MAIN_D: gl.constexpr = split[0]           # the head dim's columns in two parts
    REST_D: gl.constexpr = split[1]
    REST: gl.constexpr = REST_D > 0
    gl.static_assert(not (REST and OVERLAP), "the overlapped forward takes d 64 or 128")

    layouts: gl.constexpr = _wgmma_layouts(BLOCK_N, HEAD_D, num_warps)
    s_layout: gl.constexpr = layouts[0]
    o_layout: gl.constexpr = layouts[1]
    p_layout: gl.constexpr = layouts[2]
    r_layout: gl.constexpr = layouts[3]      # the rest columns' accumulators
    rop_layout: gl.constexpr = layouts[4]    # and their products' A operands

    q_smem, q_tail, q_ready = _own_tile(q_desc, head_row + start_m, q_rest)
    k_smem, v_smem, kv_ready = _ring_pair(k_desc, v_desc, STAGES)
    k_tail, v_tail = _rest_rings(k_rest, v_rest, k_smem, v_smem, STAGES)
    n_tiles, n_full = _key_tiles(start_m, seq, BLOCK_M, BLOCK_N, CAUSAL)
    _fill_ring(k_desc, v_desc, k_smem, v_smem, kv_ready, head_row, n_tiles, BLOCK_N, STAGES,
               k_rest, v_rest, k_tail, v_tail)
    mbarrier.wait(q_ready, 0)
    if OVERLAP:
        acc, m_i, l_i = _overlapped_tiles(
            k_desc, v_desc, q_smem, k_smem, v_smem, kv_ready, head_row, start_m, n_tiles,
            n_full, seq, qk_scale, s_layout, p_layout, o_layout, HEAD_D, BLOCK_M, BLOCK_N,
            STAGES, CAUSAL)
        acc_rest = acc
    else:
        acc, m_i, l_i, acc_rest = _waited_tiles(
            k_desc, v_desc, q_smem, k_smem, v_smem, kv_ready, head_row, start_m, n_tiles,
            n_full, seq, qk_scale, s_layout, p_layout, o_layout, MAIN_D, REST_D, BLOCK_M,
            BLOCK_N, STAGES, CAUSAL, k_rest, v_rest, q_tail, k_tail, v_tail, r_layout,
            rop_layout)

    mbarrier.invalidate(q_ready)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_ready.index(i))
    _store_outputs(o_ptr, lse_ptr, acc, m_i, l_i, head_row, start_m, seq, o_layout, s_layout,
                   HEAD_D, BLOCK_M, REST, acc_rest, r_layout)


@gluon.jit
def _waited_tiles(k_desc, v_desc, q_smem, k_smem, v_smem, kv_ready, head_row, start_m, n_tiles,
                  n_full, seq, qk_scale, s_layout: gl.constexpr, p_layout: gl.constexpr,
                  o_layout: gl.constexpr, MAIN_D: gl.constexpr, REST_D: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, k_rest, v_rest, q_tail, k_tail, v_tail,
                  r_layout: gl.constexpr, rop_layout: gl.constexpr):
    """The key tiles one after another, each wgmma waited for at once (FA-2's schedule): O's
    MAIN_D columns, and its REST_D columns (`head_split`) where the head dim has them (else O
    again)."""
    REST: gl.constexpr = REST_D > 0
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, MAIN_D], gl.float32, o_layout)
    acc_rest = acc
    if REST:
        acc_rest = gl.zeros([BLOCK_M, REST_D], gl.float32, r_layout)
    for j in range(n_tiles):
        slot = _next_slot(k_desc, v_desc, k_smem, v_smem, kv_ready, head_row, j, n_tiles,
                          BLOCK_N, STAGES, k_rest, v_rest, k_tail, v_tail)
        acc, m_i, l_i, acc_rest = _attend_tile(
            q_smem, k_smem.index(slot), v_smem.index(slot), acc, m_i, l_i, start_m, j * BLOCK_N,
            seq, qk_scale, j >= n_full, s_layout, p_layout, o_layout, BLOCK_M, BLOCK_N, CAUSAL,
            REST, q_tail, k_tail.index(slot), v_tail.index(slot), acc_rest, r_layout, rop_layout)
    return acc, m_i, l_i, acc_rest


@gluon.jit
def _overlapped_tiles(k_desc, v_desc, q_smem, k_smem, v_smem, kv_ready, head_row, start_m,
                      n_tiles, n_full, seq, qk_scale, s_layout: gl.constexpr,
                      p_layout: gl.constexpr, o_layout: gl.constexpr, HEAD_D: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr):
    """FlashAttention-3's overlap inside a warpgroup: S of the next tile and P V of this one are
    in flight while this tile's softmax runs. Per tile j, in issue order: S_{j+1} = Q K_{j+1}^T,
    the softmax of S_j, a wait that completes P_{j-1} V_{j-1}, O = alpha O, then P_j V_j; a wait
    that completes S_{j+1} ends the step (wgmma groups complete in issue order). The last
    step's S_{j+1} is its own S_j again (a spare product, so that every wait is the same).
    STAGES >= 3: a slot is refilled once P V has read it. ptxas (Triton 3.6 and 3.9) serializes
    this kernel's wgmmas, each waited for at once (`compile_for_sm90`'s serialized_wgmma): P V
    reads P from registers while the next step runs, which is why it is slower than the waited
    schedule (docs/measurements.md)."""
    gl.static_assert(STAGES >= 3, "the overlapped forward needs three K/V slots or more")
    dtype: gl.constexpr = q_smem.dtype
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    # O as an in-flight wgmma accumulator, as the loop leaves it (P_j V_j outstanding)
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout))
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(kv_ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    for j in range(n_tiles):
        ahead = gl.minimum(j + 1, n_tiles - 1)
        mbarrier.wait(kv_ready.index(ahead % STAGES), (ahead // STAGES) & 1)
        s_next = warpgroup_mma(q_smem, k_smem.index(ahead % STAGES).permute((1, 0)), zero,
                               use_acc=False, is_async=True)
        p16, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, start_m, j * BLOCK_N, seq, qk_scale,
                                             j >= n_full, s_layout, p_layout, o_layout,
                                             BLOCK_M, BLOCK_N, CAUSAL, dtype)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))      # P_{j-1} V_{j-1} done
        acc = warpgroup_mma(p16, v_smem.index(j % STAGES), acc * alpha[:, None], is_async=True)
        nxt = j + STAGES - 1                  # into the slot that P_{j-1} V_{j-1} has read
        if nxt < n_tiles:
            _issue_pair(k_desc, v_desc, k_smem, v_smem, kv_ready, head_row + nxt * BLOCK_N, nxt,
                        STAGES)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next,))    # S_{j+1} done
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, m_i, l_i


@gluon.jit
def _store_outputs(o_ptr, lse_ptr, acc, m_i, l_i, head_row, start_m, seq,
                   o_layout: gl.constexpr, s_layout: gl.constexpr, HEAD_D: gl.constexpr,
                   BLOCK_M: gl.constexpr, REST: gl.constexpr = False, acc_rest=None,
                   r_layout: gl.constexpr = None):
    """Lines 12-13: O = acc / l and the logsumexp in natural log (what the backward reads), the
    rows past the sequence's end left unwritten. With REST, O's rest columns too (`acc_rest`,
    after acc's)."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    rest = acc
    if REST:
        rest = acc_rest / gl.convert_layout(l_i, gl.SliceLayout(1, r_layout))[:, None]
    _store_split(o_ptr, acc / l_o[:, None], rest, head_row, start_m, seq, o_layout, r_layout,
                 HEAD_D, BLOCK_M, REST)
    lse_rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, s_layout))
    lse = (m_i + gl.log2(l_i)) * LN_2
    gl.store(lse_ptr + head_row + lse_rows, lse, mask=lse_rows < seq)


# --- forward, warp-specialized (FlashAttention-3's producer and consumers) -------------------
# A loader partition of one warp, with few registers, issues every TMA load: Q once, then the
# K/V tiles into the ring, each slot refilled once the consumers have released it (`kv_empty`).
# The default partition (num_warps warps, the rest of the registers) only waits, multiplies and
# releases, as `_waited_tiles` does without the loads.


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, kv_ready,
                    kv_empty, head_row, start_m, n_tiles, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr):
    """The producer: Q's tile, then K/V tile j into slot j % STAGES once it is empty (a slot's
    empty barrier starts in the phase that lets the first round through)."""
    mbarrier.expect(q_ready, q_desc.block_type.nbytes)
    _tma_load(q_desc, [head_row + start_m, 0], q_ready, q_smem)
    for j in range(n_tiles):
        mbarrier.wait(kv_empty.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
        _issue_pair(k_desc, v_desc, k_smem, v_smem, kv_ready, head_row + j * BLOCK_N, j, STAGES)


@gluon.jit
def _consume_partition(q_smem, k_smem, v_smem, q_ready, kv_ready, kv_empty, o_ptr, lse_ptr,
                       head_row, start_m, n_tiles, n_full, seq, qk_scale,
                       s_layout: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr,
                       HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """The consumers: each K/V tile as `_attend_tile` takes it, its slot released once P V has
    read it; then O and the logsumexp stored."""
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    mbarrier.wait(q_ready, 0)
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(kv_ready.index(slot), (j // STAGES) & 1)
        acc, m_i, l_i, _ = _attend_tile(q_smem, k_smem.index(slot), v_smem.index(slot), acc,
                                        m_i, l_i, start_m, j * BLOCK_N, seq, qk_scale,
                                        j >= n_full, s_layout, p_layout, o_layout, BLOCK_M,
                                        BLOCK_N, CAUSAL)
        mbarrier.arrive(kv_empty.index(slot), count=1)
    _store_outputs(o_ptr, lse_ptr, acc, m_i, l_i, head_row, start_m, seq, o_layout, s_layout,
                   HEAD_D, BLOCK_M)


@gluon.jit
def attention_fwd_specialized_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, seq, qk_scale,
                                     HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr,
                                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                     CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    bh, pid_m = _query_tile(seq, HEAD_D, CAUSAL)    # which (batch, head), which BLOCK_M queries
    head_row = bh * seq
    start_m = pid_m * BLOCK_M

    layouts: gl.constexpr = _wgmma_layouts(BLOCK_N, HEAD_D, num_warps)
    s_layout: gl.constexpr = layouts[0]
    o_layout: gl.constexpr = layouts[1]
    p_layout: gl.constexpr = layouts[2]

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    k_smem, v_smem, kv_ready = _ring_pair(k_desc, v_desc, STAGES)
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_empty.index(i), count=1)
    n_tiles, n_full = _key_tiles(start_m, seq, BLOCK_M, BLOCK_N, CAUSAL)

    gl.warp_specialize([
        (_consume_partition, (q_smem, k_smem, v_smem, q_ready, kv_ready, kv_empty, o_ptr,
                              lse_ptr, head_row, start_m, n_tiles, n_full, seq, qk_scale,
                              s_layout, p_layout, o_layout, HEAD_D, BLOCK_M, BLOCK_N, STAGES,
                              CAUSAL)),
        (_load_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, kv_ready,
                           kv_empty, head_row, start_m, n_tiles, BLOCK_N, STAGES)),
    ], [LOADER_WARPS], [LOADER_REGISTERS])

    mbarrier.invalidate(q_ready)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_ready.index(i))
        mbarrier.invalidate(kv_empty.index(i))


# --- forward, ping-pong (FlashAttention-3's consumer warpgroups, Section 3.1) ---------------
# A program owns CONSUMERS (two or three) query tiles of BLOCK_M rows, one a consumer
# warpgroup; the loader warp loads them and the K/V tiles they share. The consumers take turns
# at the tensor cores, round robin: a consumer issues its products (P_{j-1} V_{j-1}, then S_j)
# only on its turn and hands the turn to the next at once, so that each one's softmax runs
# while the others' products do. `turns` holds a barrier a consumer; the first consumer's
# starts passed. Three consumers (FlashAttention-3's 192-query tiles at d 64) give each softmax
# two consumers' products to hide behind, where at d 64 one consumer's products are short.


@triton.constexpr_function
def _consumer_registers(consumers: int) -> int:
    """Registers a thread for each of `consumers` warpgroups beside the loader's (which keeps
    LOADER_REGISTERS), of the SM's 64K: 240 for two, 160 for three (setmaxnreg takes
    multiples of 8, at most 240)."""
    share = (65536 // 128 - LOADER_REGISTERS) // consumers
    return min(PINGPONG_REGISTERS, share // 8 * 8)


@gluon.jit
def _pingpong_partition(shared, CONSUMER: gl.constexpr, CONSUMERS: gl.constexpr,
                        s_layout: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr,
                        HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Consumer CONSUMER (0 .. CONSUMERS - 1) of a program: its query tile's key tiles, each
    of its turns issuing S_j and P_{j-1} V_{j-1} and handing the turn to the next consumer,
    the softmax of S_j between turns; then as many idle turns (each releasing a K/V slot it
    does not read) as the last consumer has tiles more, so that all take the same turns; then
    O and the logsumexp."""
    (q_smem, k_smem, v_smem, q_ready, kv_ready, kv_empty, turns, o_desc, o_ptr, lse_ptr,
     head_row, start_m, seq, qk_scale) = shared   # what every consumer takes (the kernel's)
    my_turn = turns.index(CONSUMER)
    other_turn = turns.index((CONSUMER + 1) % CONSUMERS)     # the next consumer's
    my_start = start_m + CONSUMER * BLOCK_M
    n_tiles, n_full = _key_tiles(my_start, seq, BLOCK_M, BLOCK_N, CAUSAL)
    # the program's key tiles: the last (latest) query tile's
    n_walked, _ = _key_tiles(start_m + (CONSUMERS - 1) * BLOCK_M, seq, BLOCK_M, BLOCK_N, CAUSAL)
    dtype: gl.constexpr = q_smem.dtype
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    mbarrier.wait(q_ready.index(CONSUMER), 0)
    # turn 0: S_0 alone
    mbarrier.wait(kv_ready.index(0), 0)
    mbarrier.wait(my_turn, 0)
    s = warpgroup_mma(q_smem.index(CONSUMER), k_smem.index(0).permute((1, 0)),
                      gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False,
                      is_async=True)
    mbarrier.arrive(other_turn, count=1)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p16, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, my_start, 0, seq, qk_scale, n_full == 0,
                                         s_layout, p_layout, o_layout, BLOCK_M, BLOCK_N, CAUSAL,
                                         dtype)
    # turns 1 .. n_tiles - 1: S_j and P_{j-1} V_{j-1} issued on the turn, the softmax of S_j
    # while P_{j-1} V_{j-1} runs (FlashAttention-3's overlap inside a warpgroup); slot j - 1
    # released once P_{j-1} V_{j-1} is done
    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(kv_ready.index(slot), (j // STAGES) & 1)
        mbarrier.wait(my_turn, j & 1)
        s = warpgroup_mma(q_smem.index(CONSUMER), k_smem.index(slot).permute((1, 0)),
                          gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False,
                          is_async=True)
        acc = warpgroup_mma(p16, v_smem.index(prev), acc * alpha[:, None], is_async=True)
        mbarrier.arrive(other_turn, count=1)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))      # S_j done (issued first)
        p16, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, my_start, j * BLOCK_N, seq, qk_scale,
                                             j >= n_full, s_layout, p_layout, o_layout, BLOCK_M,
                                             BLOCK_N, CAUSAL, dtype)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_empty.index(prev), count=1)
    # turn n_tiles: the last P V
    last = (n_tiles - 1) % STAGES
    mbarrier.wait(my_turn, n_tiles & 1)
    acc = warpgroup_mma(p16, v_smem.index(last), acc * alpha[:, None], is_async=True)
    mbarrier.arrive(other_turn, count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(kv_empty.index(last), count=1)
    # the idle turns: the tiles only later consumers read (causal: the earlier have fewer)
    for j in range(n_tiles, n_walked):
        mbarrier.wait(kv_ready.index(j % STAGES), (j // STAGES) & 1)
        mbarrier.arrive(kv_empty.index(j % STAGES), count=1)
        mbarrier.wait(my_turn, (j + 1) & 1)
        mbarrier.arrive(other_turn, count=1)
    if my_start + BLOCK_M <= seq:
        _store_tile_by_tma(o_desc, q_smem.index(CONSUMER), lse_ptr, acc, m_i, l_i, head_row,
                           my_start, o_layout, s_layout, BLOCK_M)
    else:
        _store_outputs(o_ptr, lse_ptr, acc, m_i, l_i, head_row, my_start, seq, o_layout,
                       s_layout, HEAD_D, BLOCK_M)


@gluon.jit
def _store_tile_by_tma(o_desc, o_smem, lse_ptr, acc, m_i, l_i, head_row, start_m,
                       o_layout: gl.constexpr, s_layout: gl.constexpr, BLOCK_M: gl.constexpr):
    """`_store_outputs` for a whole tile of a consumer's queries: O into `o_smem` (its Q
    tile's buffer, free once the tile's last S is done), then to global memory by one TMA
    store, where the wgmma layout's rows made uncoalesced stores of four bytes a thread
    (278 K of them at 16 x 8192 x 128; FlashAttention-4 stores O by TMA too)."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    o_smem.store((acc / l_o[:, None]).to(o_smem.dtype))
    fence_async_shared()
    _barrier()                          # every thread's rows written before the one TMA store
    _tma_store(o_desc, [head_row + start_m, 0], o_smem)
    lse_rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, s_layout))
    gl.store(lse_ptr + head_row + lse_rows, (m_i + gl.log2(l_i)) * LN_2)
    tma.store_wait(0)                   # o_smem read before the program ends


@gluon.jit
def _pingpong_load_partition(loads, CONSUMERS: gl.constexpr, BLOCK_M: gl.constexpr,
                             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """The producer: the consumers' query tiles, then the K/V tiles the last (latest) one
    reads, each into its slot once every consumer has released the slot's previous tile."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, kv_ready, kv_empty, head_row,
     start_m, seq) = loads
    for i in gl.static_range(CONSUMERS):
        mbarrier.expect(q_ready.index(i), q_desc.block_type.nbytes)
        _tma_load(q_desc, [head_row + start_m + i * BLOCK_M, 0], q_ready.index(i),
                  q_smem.index(i))
    n_walked, _ = _key_tiles(start_m + (CONSUMERS - 1) * BLOCK_M, seq, BLOCK_M, BLOCK_N, CAUSAL)
    for j in range(n_walked):
        mbarrier.wait(kv_empty.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
        _issue_pair(k_desc, v_desc, k_smem, v_smem, kv_ready, head_row + j * BLOCK_N, j, STAGES)


@gluon.jit
def attention_fwd_pingpong_kernel(q_desc, k_desc, v_desc, o_desc, o_ptr, lse_ptr, seq,
                                  qk_scale,
                                  HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr,
                                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                  CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr,
                                  num_warps: gl.constexpr):
    gl.static_assert(num_warps == 4, "each ping-pong consumer is one warpgroup")
    gl.static_assert(CONSUMERS == 2 or CONSUMERS == 3, "a ping-pong program has 2 or 3 consumers")
    bh, pid_m = _query_tile(seq, HEAD_D, CAUSAL)     # which (batch, head), which queries
    # (CONSUMERS * BLOCK_M of them)
    head_row = bh * seq
    start_m = pid_m * CONSUMERS * BLOCK_M

    layouts: gl.constexpr = _wgmma_layouts(BLOCK_N, HEAD_D, num_warps)
    s_layout: gl.constexpr = layouts[0]
    o_layout: gl.constexpr = layouts[1]
    p_layout: gl.constexpr = layouts[2]
    REGISTERS: gl.constexpr = _consumer_registers(CONSUMERS)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS] + q_desc.block_type.shape,
                                       q_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(turns.index(i), count=1)
    mbarrier.arrive(turns.index(0), count=1)      # the first consumer's first turn
    k_smem, v_smem, kv_ready = _ring_pair(k_desc, v_desc, STAGES)
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)   # every consumer releases each tile

    shared = (q_smem, k_smem, v_smem, q_ready, kv_ready, kv_empty, turns, o_desc, o_ptr,
              lse_ptr, head_row, start_m, seq, qk_scale)
    loads = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, kv_ready, kv_empty,
             head_row, start_m, seq)
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_pingpong_partition, (shared, 0, CONSUMERS, s_layout, p_layout, o_layout, HEAD_D,
                                   BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_pingpong_partition, (shared, 1, CONSUMERS, s_layout, p_layout, o_layout, HEAD_D,
                                   BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_pingpong_load_partition, (loads, CONSUMERS, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        ], [num_warps, LOADER_WARPS], [REGISTERS, LOADER_REGISTERS])
    else:
        gl.warp_specialize([
            (_pingpong_partition, (shared, 0, CONSUMERS, s_layout, p_layout, o_layout, HEAD_D,
                                   BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_pingpong_partition, (shared, 1, CONSUMERS, s_layout, p_layout, o_layout, HEAD_D,
                                   BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_pingpong_partition, (shared, 2, CONSUMERS, s_layout, p_layout, o_layout, HEAD_D,
                                   BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
            (_pingpong_load_partition, (loads, CONSUMERS, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        ], [num_warps, num_warps, LOADER_WARPS], [REGISTERS, REGISTERS, LOADER_REGISTERS])

    for i in gl.static_range(CONSUMERS):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(turns.index(i))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_ready.index(i))
        mbarrier.invalidate(kv_empty.index(i))


# each forward kernel of KERNELS: the first two share one kernel, its schedule a constexpr
_FORWARD_KERNELS = {"forward": attention_fwd_kernel, "forward-overlap": attention_fwd_kernel,
                    "forward-specialized": attention_fwd_specialized_kernel,
                    "forward-pingpong": attention_fwd_pingpong_kernel}
