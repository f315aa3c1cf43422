"""FlashAttention-2 for Hopper (sm90) in Gluon, Triton's lower-level language: the tiles'
shared memory, the TMA loads into rings of STAGES buffers with an mbarrier each, and
`warpgroup_mma` (wgmma) for every matrix product are written out, where `tl` leaves them to
the compiler. The forward comes in four schedules (`SCHEDULES`): each wgmma waited for at once
(`waited`, the default at d 64 below 8192 keys and at d 80 and 96), FlashAttention-3's overlap
of one tile's softmax with the next tile's S and this tile's P V (`overlapped`),
FlashAttention-3's warp specialization, a loader warp issuing every TMA load while the other
warps compute (`specialized`), and the same with two or three consumer warpgroups taking turns
at the tensor cores, each overlapping its softmax with its own P V (`pingpong`, the default at
d 128, and with three consumers at d 64 from 8192 keys on; `DEFAULT_SCHEDULES`). The backward
comes in four (`BACKWARD_SCHEDULES`): a query-tile kernel for dQ and a key-tile kernel for dK
and dV (`split`, the default for shorter sequences), the key-tile kernel adding each tile's dQ
with TMA bulk reductions (`atomic`, d 64: on an H200 as fast as `split` at 16384 and slower at
4096), or FlashAttention-3's warp specialization of that kernel: a loader warp and two consumer
warpgroups each owning half the program's keys, with a warpgroup for dQ (`specialized`, d 64,
the default there from 8192 keys on) or each consumer computing half of dQ's columns
(`paired`, d 128, the default there from 4096 keys on; `DEFAULT_BACKWARD_SCHEDULES`).
`lm.attention` registers the defaults as the attention choice `flash-gluon` (the Triton FA2
where these kernels cannot take the inputs); torch.compile sees two custom operators,
`cs336::flash_gluon_fwd` and `cs336::flash_gluon_bwd`.

    o, lse = flash_gluon_forward(q, k, v, is_causal)        # (batch, heads, seq, d)
    o, lse = flash_gluon_forward(q, k, v, is_causal, "pingpong")  # or "waited", "overlapped"...
    dq, dk, dv = flash_gluon_backward(q, k, v, o, lse, do, is_causal)   # or ..., "split")
    o = FlashAttentionGluon.apply(q, k, v, is_causal)       # both, as an autograd function

q, k and v share one shape, (batch, heads, seq, d) or (batch, seq, d) as one head
(self-attention, no grouped heads), bf16 or fp16, d 64, 80, 96 or 128 (`SUPPORTED_HEAD_DIMS`;
80 and 96 as 64 columns and a rest of 16 or 32, `head_split`, in the waited forward and the split
backward), any seq.
The causal mask is SDPA's `is_causal=True`, as in `kernels.flash_triton`: query i sees keys
0..i. lse (q's shape without d, fp32) is each row's logsumexp of the scaled scores, in natural
log, as the Triton kernel saves it.

Program roles. Forward (Algorithm 1): program (bh, m) owns BLOCK_M query rows of one (batch,
head) and walks its key tiles; in the specialized schedule one more warp, the loader, issues
the program's TMA loads; in the ping-pong schedule program (bh, m) owns CONSUMERS * BLOCK_M
queries (`Tiles.query_tiles`), BLOCK_M to each of two or three consumer warpgroups, and a
loader warp. Backward (Algorithm 2), two
launches: program (bh, m) of the query-tile kernel, launched first, owns BLOCK_M queries,
computes their D = rowsum(dO * O) and walks their key tiles for dQ; program (bh, n) of the
key-tile kernel owns BLOCK_N keys and walks the query tiles that see them for dK and dV
(computing S^T and dP^T, so that keys are the rows of every product). In the atomic schedule,
program (bh, m) of the first launch computes D alone, and the key-tile kernel's programs add
dS K for each query tile they walk to that tile's dQ rows (fp32), one TMA bulk reduction a
tile, as FlashAttention-3 does; in the specialized schedule, program (n, bh) owns 2 x 64 keys,
64 to each consumer warpgroup, and a fourth warpgroup computes and adds the tile's dQ over all
of them once both consumers have written their dS^T to shared memory; in the paired schedule
each consumer then computes and adds half of the tile's dQ columns itself. These two add into
an fp32 accumulator in their threads' order, which a last launch puts back in dQ's rows
(`unpermute_dq`): stored in rows, each tile's dQ took two to four times the shared memory's
wavefronts that it takes so. A program's compute
warps are num_warps // 4 warpgroups, which split the rows of each wgmma. Heads vary fastest
over the grid (in groups whose K and V fit in L2, where not all of them do), and under the
causal mask the query-tile kernels take their tiles last first: the programs with the most key
tiles start first and the shortest fill the tail (`_query_tile`).

The TMA descriptors see q, k, v and dO as 2-D (batch * heads * seq, d) tensors: a tile that
runs past its head's last row reads the next head's rows (zeros past the tensor's end); the
masks (keys >= seq, queries >= seq) and the masked stores make them harmless. The ping-pong
forward stores a whole tile of O by TMA too, from the shared memory its Q tile leaves (a tile
that runs past its head's end by masked stores). Tiles wholly off
the causal diagonal and inside the sequence run without a mask; the others with one. The choice
is a branch around the mask alone, never around a wgmma: with the products inside a runtime
branch, Triton 3.6 compiled kernels that computed wrong scores in the branch's tiles (and read
shared memory out of range in the backward), found by the GPU tests on an H200.

`compile_for_sm90` compiles a kernel's configuration for sm90a on any machine (no GPU needed)
and returns what ptxas allotted: registers, spilled bytes, shared memory. `TILES` are the
fastest configurations of `scripts/sweep_gluon.py` on an H200.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from cs336_systems.kernels.checks import triton_interpreting
from cs336_systems.kernels.launch import (DeviceAddress, Launch, direct,
                                          eager_on_plain_tensors)

# Triton 3.6 (torch 2.11's) names the TMA load async_copy_global_to_shared, later ones async_load
# (and the store async_copy_shared_to_global, later async_store)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
# ... and the barrier of a program's warps (a partition's, in a warp-specialized kernel)
# thread_barrier, later ones barrier
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@builtin
def _tma_reduce_add(desc, coord, src, _semantic=None):
    """Add a shared-memory tile to global memory at `coord` with one TMA bulk reduction
    (cp.reduce.async.bulk.tensor ... add), as FlashAttention-3 adds dQ. Triton 3.9's Gluon
    calls it tma.async_atomic_add; 3.6's builder has the operation, its language not the
    function. Wait for it with tma.store_wait, as for a TMA store."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, coord,
                                              src.handle)


_tma_add = getattr(tma, "async_atomic_add", None) or _tma_reduce_add

LOG2_E = 1.4426950408889634
LOG2_E_GL = gl.constexpr(LOG2_E)
LN_2 = gl.constexpr(0.6931471805599453)
# the warp-specialized forward's loader partition: one warp, the fewest registers a warp may keep
LOADER_WARPS = gl.constexpr(1)
LOADER_REGISTERS = gl.constexpr(24)
# the ping-pong forward's second consumer warpgroup, and the paired backward's (the first, the
# default partition, gets as many from Triton): with the loader's warpgroup at 24, three
# warpgroups fit 64K registers
PINGPONG_REGISTERS = gl.constexpr(240)
# the specialized backward's four warpgroups at its launch's 128 registers a thread: the second
# consumer and the dQ warpgroup take these, the loader 24, the first consumer the rest (208)
CONSUMER_REGISTERS = gl.constexpr(200)
DQ_REGISTERS = gl.constexpr(80)
# bytes of K and V that the query-tile kernels' programs running at once should read (of the
# 50 MiB L2 of an H100 or H200, FlashAttention-4's budget; `_query_tile`)
L2_KV_BYTES = gl.constexpr(40 << 20)
SUPPORTED_HEAD_DIMS = (64, 80, 96, 128)
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
# the tensors a TMA descriptor sees: the inputs, and the atomic backward's fp32 dQ
_DESCRIBED = {**GL_DTYPES, torch.float32: gl.float32}


@triton.constexpr_function
def head_split(d: int) -> tuple:
    """The columns of a head dim that the kernels' tiles take in two parts: a power of two (64
    or 128) and the rest (none at d 64 and 128; 16 at d 80, 32 at d 96), a TMA tile and a wgmma
    of its own. Triton's register tensors have power-of-two shapes, so d 80 is 64 + 16 columns
    rather than 128 with 48 of them zeros."""
    main = 128 if d >= 128 else 64 if d >= 64 else d
    return main, d - main


@triton.constexpr_function
def _padded(d: int) -> int:
    """The power of two at or above d: the columns a register tile of whole rows takes."""
    return triton.next_power_of_2(d)


@triton.constexpr_function
def _wgmma_layouts(walked: int, head_d: int, num_warps: int) -> tuple:
    """A program's register layouts, its warps splitting the rows of each wgmma: the scores'
    (the program's rows by `walked` columns), the accumulators' of head_d's main columns
    (`head_split`), and the A operand's of a product into them (P, or dS, from registers);
    then the same two for its rest columns (the main ones' again where there are none)."""
    main, rest = head_split(head_d)
    scores = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                       instr_shape=[16, walked, 16])
    acc, rest_acc = (gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                               instr_shape=[16, cols, 16])
                     for cols in (main, rest or main))
    return (scores, acc, gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2), rest_acc,
            gl.DotOperandLayout(operand_index=0, parent=rest_acc, k_width=2))


@triton.constexpr_function
def _block_rows(block_m: int, cols: int) -> int:
    """Rows of 32 fp32 that a (block_m, cols) block of the dQ accumulator takes."""
    return block_m * cols // 32


@triton.constexpr_function
def _shared_tile(rows: int, cols: int, dtype) -> gl.NVMMASharedLayout:
    """The shared layout of a (rows, cols) tile that wgmma reads, either way round."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)


@gluon.jit
def _issue_pair(a_desc, b_desc, a_smem, b_smem, ready, row, tile, STAGES: gl.constexpr,
                a_rest=None, b_rest=None, a_rest_smem=None, b_rest_smem=None):
    """Start the TMA loads of tile `tile` (rows `row`..) of two tensors (K and V, or Q and dO)
    into ring slot tile % STAGES, and of their rest columns into theirs where the head dim has
    them (`a_rest`, `b_rest`: `head_split`); ready[slot] completes when all have landed."""
    slot = tile % STAGES
    bar = ready.index(slot)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + (
        0 if a_rest is None else a_rest.block_type.nbytes + b_rest.block_type.nbytes)
    mbarrier.expect(bar, nbytes)
    _tma_load(a_desc, [row, 0], bar, a_smem.index(slot))
    _tma_load(b_desc, [row, 0], bar, b_smem.index(slot))
    if a_rest is not None:
        _tma_load(a_rest, [row, a_desc.block_type.shape[1]], bar, a_rest_smem.index(slot))
        _tma_load(b_rest, [row, b_desc.block_type.shape[1]], bar, b_rest_smem.index(slot))


@gluon.jit
def _next_slot(a_desc, b_desc, a_smem, b_smem, ready, first_row, j, n_tiles,
               BLOCK: gl.constexpr, STAGES: gl.constexpr, a_rest=None, b_rest=None,
               a_rest_smem=None, b_rest_smem=None):
    """One step of a walk over n_tiles tiles from `first_row`: refill the slot that tile j - 1
    used (its wgmmas have completed) with tile j + STAGES - 1, wait for tile j; its slot."""
    nxt = j + STAGES - 1
    if nxt < n_tiles:
        _issue_pair(a_desc, b_desc, a_smem, b_smem, ready, first_row + nxt * BLOCK, nxt, STAGES,
                    a_rest, b_rest, a_rest_smem, b_rest_smem)
    slot = j % STAGES
    mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
    return slot


@gluon.jit
def _own_tile(desc, row, rest=None):
    """The program's own tile of one tensor (Q), and of its rest columns where the head dim has
    them (`rest`, else the first tile again): shared memory, the TMA loads started, and the
    barrier that completes when they have landed."""
    tile = gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ready, count=1)
    nbytes: gl.constexpr = desc.block_type.nbytes + (
        0 if rest is None else rest.block_type.nbytes)
    mbarrier.expect(ready, nbytes)
    _tma_load(desc, [row, 0], ready, tile)
    tile_rest = tile
    if rest is not None:
        tile_rest = gl.allocate_shared_memory(rest.dtype, rest.block_type.shape, rest.layout)
        _tma_load(rest, [row, desc.block_type.shape[1]], ready, tile_rest)
    return tile, tile_rest, ready


@gluon.jit
def _fill_ring(a_desc, b_desc, a_smem, b_smem, ready, first_row, n_tiles, BLOCK: gl.constexpr,
               STAGES: gl.constexpr, a_rest=None, b_rest=None, a_rest_smem=None,
               b_rest_smem=None):
    """The ring's prologue: loads of the first STAGES - 1 walked tiles (of n_tiles) started."""
    for i in gl.static_range(STAGES - 1):
        if i < n_tiles:
            _issue_pair(a_desc, b_desc, a_smem, b_smem, ready, first_row + i * BLOCK, i, STAGES,
                        a_rest, b_rest, a_rest_smem, b_rest_smem)


@gluon.jit
def _own_pair(a_desc, b_desc, row, a_rest=None, b_rest=None):
    """The program's own tiles of two tensors (K and V, or Q and dO), and of their rest columns
    where the head dim has them (else the first tiles again): shared memory for each, their TMA
    loads started; the barrier completes when all have landed."""
    a = gl.allocate_shared_memory(a_desc.dtype, a_desc.block_type.shape, a_desc.layout)
    b = gl.allocate_shared_memory(b_desc.dtype, b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ready, count=1)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + (
        0 if a_rest is None else a_rest.block_type.nbytes + b_rest.block_type.nbytes)
    mbarrier.expect(ready, nbytes)
    _tma_load(a_desc, [row, 0], ready, a)
    _tma_load(b_desc, [row, 0], ready, b)
    a_tail = a
    b_tail = b
    if a_rest is not None:
        a_tail = gl.allocate_shared_memory(a_rest.dtype, a_rest.block_type.shape, a_rest.layout)
        b_tail = gl.allocate_shared_memory(b_rest.dtype, b_rest.block_type.shape, b_rest.layout)
        _tma_load(a_rest, [row, a_desc.block_type.shape[1]], ready, a_tail)
        _tma_load(b_rest, [row, b_desc.block_type.shape[1]], ready, b_tail)
    return a, b, a_tail, b_tail, ready


@gluon.jit
def _ring(desc, STAGES: gl.constexpr):
    """A ring of STAGES slots for the tiles a program walks of one tensor."""
    return gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout)


@gluon.jit
def _ring_pair(a_desc, b_desc, STAGES: gl.constexpr, ARRIVALS: gl.constexpr = 1):
    """A ring of STAGES slots for the tiles a program walks of two tensors, a barrier a slot
    (complete once its TMA loads have landed and ARRIVALS arrivals made, the loads' one
    among them)."""
    a = _ring(a_desc, STAGES)
    b = _ring(b_desc, STAGES)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=ARRIVALS)
    return a, b, ready


@gluon.jit
def _rest_rings(a_rest, b_rest, a_smem, b_smem, STAGES: gl.constexpr):
    """Rings for the rest columns of two walked tensors where the head dim has them (else the
    main rings again): their loads share the main rings' barriers (`_issue_pair`)."""
    a_tail = a_smem
    b_tail = b_smem
    if a_rest is not None:
        a_tail = _ring(a_rest, STAGES)
        b_tail = _ring(b_rest, STAGES)
    return a_tail, b_tail


@gluon.jit
def _query_tile(seq, HEAD_D: gl.constexpr, CAUSAL: gl.constexpr):
    """The (batch, head) and the query tile that a program of a query-tile kernel (the
    forward's, dQ's) owns. Heads vary fastest over the grid, and under the causal mask, where a
    tile's key tiles grow with its index, the tiles come last first: the programs with the most
    key tiles start first and the shortest fill the tail (longest-processing-time order, as
    `kernels.flash_triton` launches its query tiles). Where all the heads' K and V do not fit
    in L2_KV_BYTES, the heads go in groups, a power of two of them as fit, each group's tiles in
    that order before the next group's (FlashAttention-4's order): the programs running at once
    then read the K and V of a few heads, which stay in L2. The key-tile kernel's own order,
    tiles fastest from the first, is already longest first and one head at a time."""
    bh = gl.program_id(0)
    tile = gl.program_id(1)
    heads = gl.num_programs(0)
    tiles = gl.num_programs(1)
    fit = L2_KV_BYTES // (seq * HEAD_D * 4)     # heads whose K and V (2 bytes a value) fit
    if fit < heads:
        group = 1
        while group * 2 <= fit:
            group *= 2
        pid = tile * heads + bh                 # the launch order: heads fastest
        first = pid // (group * tiles) * group  # the group's first head
        size = gl.minimum(heads - first, group)     # the last group may have fewer
        within = pid - first * tiles
        bh = first + within % size
        tile = within // size
    if CAUSAL:
        tile = tiles - 1 - tile
    return bh, tile


@gluon.jit
def _key_tiles(start_m, seq, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """The key tiles a query tile reads (up to its last query when causal: FA-2's early exit),
    and how many of the first ones every query sees whole, inside the sequence: no mask."""
    if CAUSAL:
        n_tiles = gl.cdiv(gl.minimum(seq, start_m + BLOCK_M), BLOCK_N)
        n_full = gl.minimum(start_m // BLOCK_N, seq // BLOCK_N)
    else:
        n_tiles = gl.cdiv(seq, BLOCK_N)
        n_full = seq // BLOCK_N
    return n_tiles, n_full


@gluon.jit
def _mask_walked(x, own_start, walked_start, seq, fill, layout: gl.constexpr,
                 OWN: gl.constexpr, WALKED: gl.constexpr, OWN_IS_QUERY: gl.constexpr,
                 CAUSAL: gl.constexpr, OWN_BOUNDED: gl.constexpr = False):
    """x (the program's own rows by the walked tile's columns) with `fill` where the walked
    index is past the sequence's end or, under the causal mask, where the key comes after the
    query: query i sees keys 0..i. The own rows are queries in the forward and dQ, keys in
    dK and dV (whose products are transposed). OWN_BOUNDED: own rows past the end too (keys
    whose dS would reach other rows' dQ)."""
    own = own_start + gl.arange(0, OWN, gl.SliceLayout(1, layout))
    walked = walked_start + gl.arange(0, WALKED, gl.SliceLayout(0, layout))
    keep = walked[None, :] < seq
    if OWN_BOUNDED:
        keep = keep & (own[:, None] < seq)
    if CAUSAL:
        if OWN_IS_QUERY:
            keep = keep & (walked[None, :] <= own[:, None])
        else:
            keep = keep & (walked[None, :] >= own[:, None])
    return gl.where(keep, x, fill)


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
_KERNEL_FUNCTIONS = {**_FORWARD_KERNELS, **_BACKWARD_KERNELS}


@gluon.jit
def _row_block(head_row, start, seq, layout: gl.constexpr, HEAD_D: gl.constexpr,
               BLOCK: gl.constexpr, COLS: gl.constexpr, FIRST: gl.constexpr):
    """BLOCK rows from `start` by COLS columns from FIRST of one head's rows of a (batch *
    heads * seq, HEAD_D) tensor: the rows' positions in the head, each element's offset, and
    which elements are inside the sequence and the row, in `layout`."""
    rows = start + gl.arange(0, BLOCK, gl.SliceLayout(1, layout))
    cols = FIRST + gl.arange(0, COLS, gl.SliceLayout(0, layout))
    inside = (rows < seq)[:, None]
    if FIRST + COLS > HEAD_D:           # a power-of-two block over d 80 or 96
        inside = inside & (cols < HEAD_D)[None, :]
    return rows, (head_row + rows)[:, None] * HEAD_D + cols[None, :], inside


@gluon.jit
def _row_dots(a_ptr, b_ptr, head_row, start, seq, HEAD_D: gl.constexpr, BLOCK: gl.constexpr,
              num_warps: gl.constexpr):
    """The rows, and rowsum(a * b) in fp32, of BLOCK rows from `start` of two (batch * heads *
    seq, d) tensors, rows past seq zero: D = rowsum(dO * O) (Algorithm 2, line 4)."""
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                            warps_per_cta=[num_warps, 1], order=[1, 0])
    rows, offsets, inside = _row_block(head_row, start, seq, layout, HEAD_D, BLOCK,
                                       _padded(HEAD_D), 0)
    a = gl.load(a_ptr + offsets, mask=inside, other=0.0).to(gl.float32)
    b = gl.load(b_ptr + offsets, mask=inside, other=0.0).to(gl.float32)
    return rows, gl.sum(a * b, axis=1)


@gluon.jit
def _store_split(ptr, values, rest, head_row, start, seq, layout: gl.constexpr,
                 r_layout: gl.constexpr, HEAD_D: gl.constexpr, BLOCK: gl.constexpr,
                 REST: gl.constexpr):
    """BLOCK rows of an output (`_store_rows`): its main columns from `values` and, with REST,
    its rest columns (`head_split`) from `rest`, in `r_layout`."""
    _store_rows(ptr, values, head_row, start, seq, layout, HEAD_D, BLOCK)
    if REST:
        _store_rows(ptr, rest, head_row, start, seq, r_layout, HEAD_D, BLOCK, values.shape[1])


@gluon.jit
def _store_rows(ptr, values, head_row, start, seq, layout: gl.constexpr, HEAD_D: gl.constexpr,
                BLOCK: gl.constexpr, FIRST: gl.constexpr = 0):
    """BLOCK rows of a (batch * heads * seq, HEAD_D) output from `start`, its columns from
    FIRST as many as `values` has, those past seq unwritten."""
    _, offsets, inside = _row_block(head_row, start, seq, layout, HEAD_D, BLOCK,
                                    values.shape[1], FIRST)
    gl.store(ptr + offsets, values.to(ptr.dtype.element_ty), mask=inside)


@dataclass(frozen=True)
class Tiles:
    """One launch configuration: rows of the program's own tile (block_m: queries of the
    forward and of dQ; block_n: keys of dK and dV), rows of the tiles it walks, ring slots,
    warps; and, for the ping-pong forward, its query tiles a program (one a consumer
    warpgroup)."""

    block_m: int = 128
    block_n: int = 128
    stages: int = 2
    num_warps: int = 8
    # registers a thread the kernel is compiled for (Triton's maxnreg); the warp-specialized
    # kernels hand their loader LOADER_REGISTERS of them and their other warpgroups the rest
    max_registers: int | None = None
    query_tiles: int = 1

    def launch_options(self) -> dict:
        options = {"num_warps": self.num_warps}
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return options


KERNELS = ("forward", "forward-overlap", "forward-specialized", "forward-pingpong", "dkdv", "dq",
           "dkdv-atomic", "dkdv-specialized", "dkdv-paired", "delta")
# the forward's schedules, each the kernel of KERNELS that runs it: each wgmma waited for
# (FlashAttention-2's), FlashAttention-3's overlap inside a warpgroup, FlashAttention-3's
# producer and consumer warps (a loader warp and the compute warps), and its ping-pong (a loader
# warp and two or three consumer warpgroups taking turns)
SCHEDULES = {"waited": "forward", "overlapped": "forward-overlap",
             "specialized": "forward-specialized", "pingpong": "forward-pingpong"}
# the schedule a forward runs unless told, per head dim and from which sequence length on:
# the fastest on an H200 (docs/measurements.md, "The Gluon forward's ping-pong schedule" and
# "Three ping-pong consumers at d 64"). At d 128 the ping-pong forward took 0.92x to 0.95x the
# waited one's time at 4096 and tied it at 16384. At d 64 its three consumers (192-query
# programs) took 0.93x and 0.88x the waited one's time at 16 x 16384 in two processes, 0.94x
# at 16 x 8192 and 0.91x at 32 x 8192 (replayed from CUDA graphs), but 1.03x at 8 x 8192 and
# 1.15x to 1.54x at 4096 and shorter, where its programs are too few to fill the GPU
DEFAULT_SCHEDULES = {64: {0: "waited", 8192: "pingpong"}, 80: {0: "waited"}, 96: {0: "waited"},
                     128: {0: "pingpong"}}
# the kernels that take d 80 and 96 (`head_split`), each with TMA descriptors of the rest
# columns after its main ones (None at d 64 and 128): the waited forward and the split backward
_SPLIT_D_KERNELS = ("forward", "forward-overlap", "dq", "dkdv", "dkdv-atomic")
# the kernels whose programs own query tiles, heads fastest over their grid (`_query_tile`); the
# others' own key tiles (dK, dV) or rows of D, tiles fastest
_QUERY_TILE_KERNELS = ("forward", "forward-overlap", "forward-specialized", "forward-pingpong",
                       "dq")
# the forward kernels that take O's TMA descriptor (`_store_tile_by_tma`) before its pointer
_O_BY_TMA = ("forward-pingpong",)
# the backward's, each its kernels of KERNELS in launch order: the query-tile kernel (dQ and D)
# then the key-tile kernel (dK, dV), FlashAttention-2's five products and two more (S and dP
# for dQ); or D alone, then a key-tile kernel adding each tile's dQ with a TMA bulk reduction,
# five products (FlashAttention-3's dQ): every warp loading and computing (atomic), or a loader
# warp and two consumer warpgroups, with a dQ warpgroup (specialized) or each consumer adding
# half of dQ's columns (paired: FlashAttention-3's tiles at d 128, where dK and dV alone take a
# consumer 128 registers a thread and a dQ warpgroup would leave it too few)
BACKWARD_SCHEDULES = {"split": ("dq", "dkdv"), "atomic": ("delta", "dkdv-atomic"),
                      "specialized": ("delta", "dkdv-specialized"),
                      "paired": ("delta", "dkdv-paired")}
# the schedule a backward runs unless told, per head dim and from which sequence length on:
# the fastest on an H200 (docs/measurements.md, "The warp-specialized Gluon backward"). At d 64
# the specialized backward's programs own 128 keys each, and below 8192 too few of them fill
# the GPU: replayed from CUDA graphs it took 0.86x split's time at 16 x 16384, 0.95x at
# 8 x 8192, the same at 16 x 4096 and 16 x 1024, 1.07x at 32 x 2048 and 1.22x at 48 x 512.
# At d 128 the paired backward took 0.78x split's time at 16 x 16384, 0.90x at 16 x 8192 and
# 0.965x at 16 x 4096, and 1.04x at 32 x 2048 (the same measurement, docs/measurements.md)
DEFAULT_BACKWARD_SCHEDULES = {64: {0: "split", 8192: "specialized"}, 80: {0: "split"},
                              96: {0: "split"}, 128: {0: "split", 4096: "paired"}}


def _by_length(by_length: dict, seq: int) -> str:
    return by_length[max(length for length in by_length if length <= seq)]


def default_schedule(d: int, seq: int) -> str:
    """The forward's schedule of DEFAULT_SCHEDULES for head dim d at length seq."""
    return _by_length(DEFAULT_SCHEDULES.get(d, {0: "waited"}), seq)


def default_backward_schedule(d: int, seq: int) -> str:
    """The schedule of DEFAULT_BACKWARD_SCHEDULES for head dim d at length seq."""
    return _by_length(DEFAULT_BACKWARD_SCHEDULES.get(d, {0: "split"}), seq)


# Per kernel and head dim: the fastest tiles of scripts/sweep_gluon.py on an H200 at 16 heads
# of 16384 causal bf16 (Triton 3.6), each compiling for sm90a within shared memory
# (compile_for_sm90): at d 64 four warps with two or three programs an SM beat eight warps with
# one, for every kernel but the overlapped forward.
TILES = {
    "forward": {64: Tiles(block_m=64, block_n=128, num_warps=4), 128: Tiles(block_n=64)},
    "forward-overlap": {64: Tiles(block_n=64, stages=3),
                        128: Tiles(block_m=64, block_n=64, stages=3, num_warps=4)},
    # two programs an SM at d 64 (4 + 4 warps at 128 registers), one at d 128 (8 + 4 warps at
    # 168, the compute warps keeping 240)
    "forward-specialized": {64: Tiles(block_m=64, num_warps=4, max_registers=128),
                            128: Tiles(max_registers=168)},
    # block_m rows a consumer warpgroup (a program owns two tiles); the launch's 168 registers a
    # thread over three warpgroups, the consumers then taking 240 and the loader 24. At d 128,
    # 128-key tiles in three slots (224 KiB of shared memory, all but 3 KiB of it): 1.896 ms
    # against 2.126 with 64-key tiles in four slots at 16 x 16384, 0.134 against 0.148 at
    # 16 x 4096 and 0.084 against 0.089 at 32 x 2048; in two slots they were the slowest (2.273
    # ms at 16 x 16384). A 128-key tile's softmax takes fewer instructions a score: O is
    # rescaled once per 128 keys (docs/measurements.md)
    # At d 64 three consumers, 192 queries a program (FlashAttention-3's tiles there): a
    # consumer's products are half as long as at d 128, and its softmax hides behind two
    # others' (the launch's 128 registers a thread over four warpgroups, the consumers then
    # taking 160). Forward alone at 16 x 16384, replayed from CUDA graphs: 1.193 ms against two
    # consumers' 1.257 and the waited forward's 1.277 (four slots: 1.177, a tie; 64-key tiles:
    # 1.251 to 1.269). Its consumers spill a few registers (SPILLED_BYTES)
    "forward-pingpong": {64: Tiles(block_m=64, block_n=128, stages=3, num_warps=4,
                                   max_registers=128, query_tiles=3),
                         128: Tiles(block_m=64, block_n=128, stages=3, num_warps=4,
                                    max_registers=168, query_tiles=2)},
    # at d 64, 64-query tiles: a tie with 128 (4.125 against 4.112 ms of backward) without the
    # 128's 56 bytes of spilled registers a thread
    "dkdv": {64: Tiles(block_m=64, block_n=64, num_warps=4),
             128: Tiles(block_m=64, block_n=64, num_warps=4)},
    "dq": {64: Tiles(block_m=64, block_n=64, stages=3, num_warps=4),
           128: Tiles(block_m=64, block_n=64, num_warps=4)},
    # the atomic backward's key-tile tiles (220 registers): 3.76 to 4.28 ms of backward at
    # 16 x 16384 over four probes, against the split one's 3.73 to 3.90 in the same processes
    # (three slots: 3.76 and 3.79; 64 x 128 keys on eight warps: 4.79 and 5.08). d 64 only:
    # at d 128 its fp32 dQ buffers and K, V, Q and dO tiles take 139 KiB of shared memory, a
    # program an SM (10.2 ms against the split one's 6.3)
    "dkdv-atomic": {64: Tiles(block_m=64, block_n=64, num_warps=4)},
    # block_n keys a program, half to each consumer warpgroup (num_warps each); the launch's 128
    # registers a thread over four warpgroups (CONSUMER_REGISTERS). d 64 only: 3.09 and 3.15 ms
    # of backward at 16 x 16384 against cuDNN's 3.22 and 3.21 in one process. At d 128 its
    # earlier forms spilled and were slower than split but at 16384 (docs/measurements.md)
    "dkdv-specialized": {64: Tiles(block_m=64, block_n=128, num_warps=4, max_registers=128)},
    # the same without the dQ warpgroup, each consumer computing half of dQ's columns, d 128
    # only: the launch's 168 registers a thread over three warpgroups, the consumers then taking
    # 240 (PINGPONG_REGISTERS). 193 KiB of shared memory, one program an SM; three slots (225
    # KiB) were slower in one process: 5.35 against 5.23 ms of backward at 16 x 16384, 0.456
    # against 0.448 at 16 x 4096
    "dkdv-paired": {128: Tiles(block_m=64, block_n=128, num_warps=4, max_registers=168)},
    # block_m rows a program
    "delta": {64: Tiles(block_m=64, num_warps=4), 128: Tiles(block_m=64, num_warps=4)},
}
# bytes a thread spills (`compile_for_sm90`) where the fastest tiles spill at all: the
# three-consumer forward at d 64, whose consumers keep 160 registers a thread. ptxas keeps the
# mask's key columns out of registers, stored once a program and reloaded only in the tiles that
# take the mask (40 bytes under Triton 3.6, 80 under 3.9); the times above include them
SPILLED_BYTES = {("forward-pingpong", 64): 80}
# d 80 and 96 (`head_split`: 64 columns and a rest) take d 128's tiles, in the kernels that take
# them (`_SPLIT_D_KERNELS`, the waited forward and the split backward). Replayed from CUDA graphs
# on an H200, the step (forward and backward) at d 128's forward and dQ tiles took 0.852x and
# 0.837x cuDNN's time at 32 x 2048 x 80 (d 64's: 0.857x), 0.910x and 0.881x at 128 x 512 x 80
# (0.916x) and 0.907x and 0.903x at 32 x 2048 x 96 (0.919x), each tried alone
# (docs/measurements.md, "Head dims of 80 and 96")
for _kernel in ("forward", "dq", "dkdv"):
    TILES[_kernel].update({d: TILES[_kernel][128] for d in (80, 96)})


@functools.cache
def _shared_layout(rows: int, d: int, dtype) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for([rows, d], dtype)


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why the kernels cannot take q, k and v here (each reason saying what is supported), or
    None where they can."""
    if q.ndim not in (3, 4) or q.shape != k.shape or q.shape != v.shape:
        return (f"the Gluon kernels take q, k, v of one (batch, heads, seq, d) or (batch, seq, "
                f"d) shape; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.numel() == 0:   # a TMA descriptor describes no empty tensor
        return f"the Gluon kernels take at least one row of q, k, v; got {tuple(q.shape)}"
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        return (f"the Gluon kernels support d in {SUPPORTED_HEAD_DIMS}; got {q.shape[-1]} "
                f"(kernels.flash_triton takes any d up to 256)")
    if q.dtype not in GL_DTYPES or len({q.dtype, k.dtype, v.dtype}) != 1:
        return (f"the Gluon kernels take q, k, v of one dtype of bfloat16, float16; got "
                f"{q.dtype}, {k.dtype}, {v.dtype}")
    # the device's properties, which torch.compile folds to a constant (not its capability)
    if not (q.is_cuda and torch.cuda.get_device_properties(q.device).major == 9):
        return f"the Gluon kernels run on a Hopper GPU (sm90); got {q.device}"
    return None


def check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raises ValueError with `unsupported_reason` where the kernels cannot take the inputs."""
    reason = unsupported_reason(q, k, v)
    if reason:
        raise ValueError(reason)


def _rows(*tensors: Tensor) -> list[Tensor]:
    """(batch, heads, seq, d) or (batch, seq, d) tensors, contiguous: the kernels read each as
    (batch * heads * seq, d) rows."""
    return [t.contiguous() for t in tensors]


def _descriptor(t: Tensor, block_rows: int, block_cols: int | None = None):
    """A TMA descriptor of contiguous `t` as rows of its last dim, in tiles of block_rows by
    block_cols (by default all of a row; a kernel says from which column it loads a tile).
    Cached by address, shape and tile (`_described`): a training step's tensors come back at
    the addresses of the step before, and making a descriptor took about 5 us of host time."""
    assert t.is_contiguous(), "a descriptor describes contiguous rows"
    d = t.shape[-1]
    return _described(t.data_ptr(), t.dtype, t.numel() // d, d, block_rows, block_cols or d)


@functools.lru_cache(maxsize=4096)
def _described(address: int, dtype: torch.dtype, rows: int, d: int, block_rows: int,
               block_cols: int, unswizzled: bool = False):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = (_ACCUMULATOR_LAYOUT if unswizzled
              else _shared_layout(block_rows, block_cols, _DESCRIBED[dtype]))
    return TensorDescriptor(DeviceAddress(address, dtype), [rows, d], [d, 1],
                            [block_rows, block_cols], layout)


# the specialized and paired backward's dQ accumulator: rows of 32 fp32 in the warpgroups'
# thread order (`_thread_order`), a TMA tile of them as they lie in shared memory, unswizzled
_ACCUMULATOR_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _dq_accumulator(kernel: str, heads: int, seq: int, d: int,
                    device: torch.device) -> tuple[Tensor, object]:
    """The zeroed fp32 dQ accumulator of a key-tile kernel that adds dQ in thread order
    (`dkdv-specialized`, `dkdv-paired`): a (block_m, d) block a query tile, tails included,
    each warpgroup's (block_m, `_dq_columns`) part of it in `_thread_order`; and the TMA
    descriptor of one such part. `unpermute_dq` reads it back in rows."""
    block_m = TILES[kernel][d].block_m
    acc = torch.zeros(heads * triton.cdiv(seq, block_m) * block_m * d // 32, 32,
                      dtype=torch.float32, device=device)
    return acc, _described(acc.data_ptr(), acc.dtype, acc.shape[0], 32,
                           _block_rows(block_m, _dq_columns(kernel, d)), 32, True)


@triton.jit
def unpermute_dq(acc_ptr, dq_ptr, seq, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 PARTS: tl.constexpr):
    """dQ's rows of one query tile (program 0) of one (batch, head) (program 1), in dQ's dtype,
    from the tile's block of the fp32 accumulator (`_dq_accumulator`): its PARTS column parts
    one after the other, each in the warpgroup's thread order (`_thread_order`)."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    block = head * tl.cdiv(seq, BLOCK_M) + tile
    x = tl.load(acc_ptr + block * BLOCK_M * HEAD_D + tl.arange(0, BLOCK_M * HEAD_D))
    x = tl.reshape(x, [PARTS, 4, HEAD_D // PARTS // 8, 8, 4, 2, 2])  # part, w, j, lane/4,
    x = tl.permute(x, (1, 5, 3, 0, 2, 4, 6))                         # lane%4, h, e
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_D)
    tl.store(dq_ptr + (head * seq + rows)[:, None] * HEAD_D + cols[None, :],
             tl.reshape(x, [BLOCK_M, HEAD_D]).to(dq_ptr.dtype.element_ty),
             mask=rows[:, None] < seq)


def _dq_columns(kernel: str, d: int) -> int:
    """The columns of dQ that one TMA reduction of a key-tile kernel adds: half of them where
    each consumer adds its own half (`dkdv-paired`)."""
    return d // 2 if kernel == "dkdv-paired" else d


def _check_schedule(schedule: str, schedules: dict = SCHEDULES) -> None:
    if schedule not in schedules:
        raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(schedules)}")


def _schedule_constants(kernel: str) -> dict:
    """The constexprs that pick a kernel's schedule, in its arguments' order."""
    if kernel in ("forward", "forward-overlap"):
        return {"OVERLAP": kernel == "forward-overlap"}
    if kernel in ("dkdv", "dkdv-atomic"):
        return {"ATOMIC_DQ": kernel == "dkdv-atomic"}
    if kernel in ("dkdv-specialized", "dkdv-paired"):
        return {"DQ_WARPGROUP": kernel == "dkdv-specialized"}
    return {}


def _constants(kernel: str, d: int, is_causal: bool, tiles: Tiles) -> dict:
    """The kernel's constexprs, in its arguments' order."""
    if kernel == "delta":
        return {"HEAD_D": d, "BLOCK": tiles.block_m}
    consumers = {"CONSUMERS": tiles.query_tiles} if kernel == "forward-pingpong" else {}
    return {"HEAD_D": d, "BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n,
            "STAGES": tiles.stages, "CAUSAL": is_causal, **_schedule_constants(kernel),
            **consumers}


@functools.lru_cache(maxsize=1024)
def _launch_plan(kernel: str, heads: int, seq: int, d: int, is_causal: bool,
                 tiles: Tiles) -> Launch:
    """One of KERNELS in `tiles` over `heads` (batch x heads) sequences of seq rows at head dim
    d: a program per tile of rows it owns of each sequence (queries for the forward, dQ and D,
    keys for dK and dV), (heads, tiles) for the query-tile kernels (`_query_tile`), (tiles,
    heads) for the others; its constexprs and launch options. Made once a shape and tile set (as
    the Triton FA2's plans): the eager host time of a step is what bounds the shorter
    sequences."""
    own_rows = tiles.block_n if kernel.startswith("dkdv") else tiles.block_m * tiles.query_tiles
    grid = (heads, triton.cdiv(seq, own_rows))
    return Launch(grid if kernel in _QUERY_TILE_KERNELS else grid[::-1],
                  {**_constants(kernel, d, is_causal, tiles), **tiles.launch_options()})


def _launch(kernel: str, shape: tuple[int, int, int], is_causal: bool, *args) -> None:
    """Launches one of KERNELS over (heads, seq, d) rows with `args`, in its TILES as they are
    now (a sweep changes them), with its plan's grid and keyword arguments."""
    plan = _launch_plan(kernel, *shape, is_causal, TILES[kernel][shape[2]])
    direct(_KERNEL_FUNCTIONS[kernel])[plan.grid](*args, **plan.kwargs)


def _operands(kernel: str, d: int, *rows: Tensor) -> list:
    """TMA descriptors of q, k, v (and dO, or the forward's O) rows for the kernel's tiles
    (`_operand_tiles`)."""
    return [tile and _descriptor(rows[tile[0]], *tile[1:])
            for tile in _operand_tiles(kernel, d, TILES[kernel][d], len(rows))]


@functools.lru_cache(maxsize=256)
def _operand_tiles(kernel: str, d: int, tiles: Tiles, n_rows: int) -> tuple:
    """(which of q, k, v, dO (or O), tile rows, tile columns) of each of a kernel's descriptor
    arguments: queries and dO (the forward's O for _O_BY_TMA) in tiles of block_m rows, keys
    and values of block_n, each of the head dim's main columns (`head_split`); then, for the
    kernels of _SPLIT_D_KERNELS, the same of its rest columns (None where there are none)."""
    main, rest = head_split(d)
    parts = [main] + ([rest] if kernel in _SPLIT_D_KERNELS else [])
    blocks = (tiles.block_m, tiles.block_n, tiles.block_n, tiles.block_m)[:n_rows]
    return tuple((i, block_rows, cols) if cols else None
                 for cols in parts for i, block_rows in enumerate(blocks))


def _rows_shape(q: Tensor) -> tuple[int, int, int]:
    """(heads, seq, d) of the kernels' rows: every (batch, head) a sequence of its own."""
    *heads, seq, d = q.shape
    return math.prod(heads), seq, d


def flash_gluon_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                        schedule: str | None = None) -> tuple[Tensor, Tensor]:
    """o and the logsumexp of softmax(q k^T / sqrt(d)) v, one launch of the kernel that runs
    `schedule` (one of SCHEDULES, by default `default_schedule`'s for the shape; see the
    module)."""
    if schedule is not None:
        _check_schedule(schedule)
        takes = tuple(TILES[SCHEDULES[schedule]])
        if q.shape[-1] in SUPPORTED_HEAD_DIMS and q.shape[-1] not in takes:
            raise ValueError(f"the {schedule} forward takes d in {takes}; got {q.shape[-1]}")
    check_inputs(q, k, v)
    shape = _rows_shape(q)
    seq, d = shape[1:]
    kernel = SCHEDULES[schedule or default_schedule(d, seq)]
    q, k, v = _rows(q, k, v)
    o = torch.empty_like(q)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    described = (q, k, v, o) if kernel in _O_BY_TMA else (q, k, v)
    _launch(kernel, shape, is_causal, *_operands(kernel, d, *described), o, lse, seq,
            d ** -0.5 * LOG2_E)
    return o, lse


def flash_gluon_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                         grad_o: Tensor, is_causal: bool = False, schedule: str | None = None
                         ) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv from the forward's o and logsumexp, as `schedule` (BACKWARD_SCHEDULES; by
    default `default_backward_schedule`'s for the shape) runs them. "split": the query-tile
    kernel (dQ, and D = rowsum(dO * O) for each of its rows), then the key-tile kernel (dK, dV),
    which reads D. "atomic" and "specialized": D alone, then a key-tile kernel which also adds
    each tile's dQ in fp32 with TMA bulk reductions, its warps all loading and computing
    (no faster than split on an H200) or a loader warp and two consumer warpgroups, with a dQ
    warpgroup ("specialized") or each adding half of dQ's columns ("paired")
    (docs/measurements.md)."""
    if schedule is not None:
        _check_schedule(schedule, BACKWARD_SCHEDULES)
    schedule = schedule or default_backward_schedule(q.shape[-1], q.shape[-2])
    if any(q.shape[-1] not in TILES[kernel] for kernel in BACKWARD_SCHEDULES[schedule]):
        raise ValueError(f"the {schedule} backward takes d in "
                         f"{tuple(TILES[BACKWARD_SCHEDULES[schedule][-1]])}; got {q.shape[-1]}")
    check_inputs(q, k, v)
    return _backward(q, k, v, o, lse, grad_o, is_causal, schedule)


def _backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, grad_o: Tensor,
              is_causal: bool, schedule: str) -> tuple[Tensor, Tensor, Tensor]:
    """`flash_gluon_backward` on inputs it has checked (or the forward has)."""
    shape = _rows_shape(q)
    seq, d = shape[1:]
    scales = (d ** -0.5 * LOG2_E, d ** -0.5)
    q, k, v, grad_o, o, lse = _rows(q, k, v, grad_o, o, lse)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty_like(lse)
    if schedule == "split":
        dq = torch.empty_like(q)
        _launch("dq", shape, is_causal, *_operands("dq", d, q, k, v, grad_o), dq, o, grad_o,
                lse, delta, seq, *scales)
        _launch("dkdv", shape, is_causal, *_operands("dkdv", d, q, k, v, grad_o), dq, dk, dv,
                lse, delta, seq, *scales)
        return dq, dk, dv
    _launch("delta", shape, is_causal, o, grad_o, delta, seq)
    kernel = BACKWARD_SCHEDULES[schedule][-1]
    if kernel == "dkdv-atomic":     # dQ's fp32 rows themselves
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        _launch(kernel, shape, is_causal, *_operands(kernel, d, q, k, v, grad_o),
                _descriptor(dq, TILES[kernel][d].block_m), dk, dv, lse, delta, seq, *scales)
        return dq.to(q.dtype), dk, dv
    acc, acc_desc = _dq_accumulator(kernel, *shape, q.device)
    _launch(kernel, shape, is_causal, *_operands(kernel, d, q, k, v, grad_o), acc_desc, dk, dv,
            lse, delta, seq, *scales)
    dq = torch.empty_like(q)
    block_m = TILES[kernel][d].block_m
    direct(unpermute_dq)[(triton.cdiv(seq, block_m), shape[0])](
        acc, dq, seq, HEAD_D=d, BLOCK_M=block_m, PARTS=d // _dq_columns(kernel, d))
    return dq, dk, dv


# --- custom operators (what torch.compile sees: one opaque call each way) and autograd -------

def _forward_outputs(q: Tensor) -> tuple[Tensor, Tensor]:
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


@torch.library.custom_op("cs336::flash_gluon_fwd", mutates_args=())
def flash_gluon_fwd(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                    schedule: str | None) -> tuple[Tensor, Tensor]:
    return flash_gluon_forward(q, k, v, is_causal, schedule)


@flash_gluon_fwd.register_fake
def _flash_gluon_fwd_fake(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                          schedule: str | None) -> tuple[Tensor, Tensor]:
    return _forward_outputs(q)


@torch.library.custom_op("cs336::flash_gluon_bwd", mutates_args=())
def flash_gluon_bwd(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, grad_o: Tensor,
                    is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    return flash_gluon_backward(q, k, v, o, lse, grad_o, is_causal)


@flash_gluon_bwd.register_fake
def _flash_gluon_bwd_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                          grad_o: Tensor, is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _gradients(ctx, grad_o: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v, o, lse = ctx.saved_tensors
    if eager_on_plain_tensors(q, grad_o):   # checked by the forward
        return _backward(q, k, v, o, lse, grad_o, ctx.is_causal,
                         default_backward_schedule(q.shape[-1], q.shape[-2]))
    return torch.ops.cs336.flash_gluon_bwd(q, k, v, o, lse, grad_o, ctx.is_causal)


def _save(ctx, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, is_causal: bool) -> None:
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.is_causal = is_causal


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, is_causal, _ = inputs
    _save(ctx, q, k, v, *output, is_causal)
    ctx.mark_non_differentiable(output[1])  # the logsumexp is for the backward only


def _op_backward(ctx, grad_o: Tensor, _grad_lse) -> tuple[Tensor | None, ...]:
    return *_gradients(ctx, grad_o), None, None


flash_gluon_fwd.register_autograd(_op_backward, setup_context=_setup_context)


class FlashAttentionGluon(torch.autograd.Function):
    """`FlashAttentionGluon.apply(q, k, v, is_causal=False, schedule=None)` -> o, for
    (batch, heads, seq, d) or (batch, seq, d) inputs: the Gluon forward and backward, through the
    `cs336::flash_gluon_fwd` and `cs336::flash_gluon_bwd` operators under torch.compile and
    directly in eager mode (`launch.eager_on_plain_tensors`)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                schedule: str | None = None) -> Tensor:
        # The kernels read contiguous rows. A model's heads are views of token-major q, k, v:
        # copied here, before the operator, they are copied once a step rather than again in
        # the backward (which reads the saved copies), and under torch.compile Inductor can
        # write them so in the kernel that makes them (the rotary embedding's).
        q, k, v = _rows(q, k, v)
        if eager_on_plain_tensors(q):
            output = flash_gluon_forward(q, k, v, is_causal, schedule)
        else:
            output = torch.ops.cs336.flash_gluon_fwd(q, k, v, is_causal, schedule)
        _save(ctx, q, k, v, *output, is_causal)
        return output[0]

    @staticmethod
    def backward(ctx, grad_o: Tensor) -> tuple[Tensor | None, ...]:
        return *_gradients(ctx, grad_o), None, None


def compile_for_sm90(kernel: str, d: int, is_causal: bool, tiles: Tiles | None = None,
                     dtype: torch.dtype = torch.bfloat16) -> dict:
    """Compile one of `KERNELS` for sm90a here (no GPU needed): its registers a thread, bytes
    spilled to local memory, bytes of shared memory and whether ptxas serialized its wgmmas,
    from the cubin. Where this process runs
    Triton's interpreter (a CPU machine: `kernels` turns it on), in a child process without it:
    Gluon kernels compile, they do not interpret."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; allowed: {', '.join(KERNELS)}")
    tiles = tiles or TILES[kernel][d]
    if not triton_interpreting():
        return _resource_usage(kernel, d, is_causal, tiles, dtype)
    call = (f"import json, torch; from {__name__} import Tiles, _resource_usage; print(json."
            f"dumps(_resource_usage({kernel!r}, {d}, {is_causal}, {tiles!r}, {dtype})))")
    done = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True,
                          check=False, env={**os.environ, "TRITON_INTERPRET": "0"})
    if done.returncode != 0:
        raise RuntimeError(f"compiling the Gluon {kernel} kernel for sm90a failed:\n"
                           f"{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def _signature(kernel: str, d: int, tiles: Tiles, dtype: torch.dtype) -> dict:
    """The kernel's argument types as the compiler reads them (TMA descriptors with their block
    and shared layout)."""
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    main, rest = head_split(d)

    def descriptor(block_rows, cols=main):
        layout = _shared_layout(block_rows, cols, GL_DTYPES[dtype])
        return f"tensordesc<{name}[{block_rows}, {cols}],{layout!r}>"

    def rests(*block_rows):     # the rest columns' descriptors, constexpr None without them
        names = ("q_rest", "k_rest", "v_rest", "do_rest")
        return {n: descriptor(r, rest) if rest else "constexpr" for n, r in zip(names, block_rows)}

    if kernel == "delta":
        return {"o_ptr": f"*{name}", "do_ptr": f"*{name}", "delta_ptr": "*fp32", "seq": "i32"}
    q_rows, kv_rows = tiles.block_m, tiles.block_n      # query tiles, key tiles, every kernel
    tensors = {"q_desc": descriptor(q_rows), "k_desc": descriptor(kv_rows),
               "v_desc": descriptor(kv_rows)}
    split = kernel in _SPLIT_D_KERNELS
    if kernel in _O_BY_TMA:
        tensors["o_desc"] = descriptor(q_rows)
    if kernel.startswith("forward"):
        return {**tensors, **(rests(q_rows, kv_rows, kv_rows) if split else {}),
                "o_ptr": f"*{name}", "lse_ptr": "*fp32", "seq": "i32", "qk_scale": "fp32"}
    tensors["do_desc"] = descriptor(q_rows)
    if split:
        tensors.update(rests(q_rows, kv_rows, kv_rows, q_rows))
    if kernel.startswith("dkdv"):   # dQ: the split one's unused, the atomic one's fp32 tiles
        if kernel == "dkdv":
            dq = f"*{name}"
        elif kernel == "dkdv-atomic":
            dq = f"tensordesc<fp32[{q_rows}, {d}],{_shared_layout(q_rows, d, gl.float32)!r}>"
        else:       # a warpgroup's part of the accumulator (`_dq_accumulator`)
            rows = _block_rows(q_rows, _dq_columns(kernel, d))
            dq = f"tensordesc<fp32[{rows}, 32],{_ACCUMULATOR_LAYOUT!r}>"
        pointers = {"dq_desc": dq, "dk_ptr": f"*{name}", "dv_ptr": f"*{name}"}
    else:
        pointers = {"dq_ptr": f"*{name}", "o_ptr": f"*{name}", "do_ptr": f"*{name}"}
    return {**tensors, **pointers, "lse_ptr": "*fp32", "delta_ptr": "*fp32", "seq": "i32",
            "qk_scale": "fp32", "sm_scale": "fp32"}


def _resource_usage(kernel: str, d: int, is_causal: bool, tiles: Tiles,
                    dtype: torch.dtype) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _KERNEL_FUNCTIONS[kernel]
    arguments = _signature(kernel, d, tiles, dtype)
    constants = {**_constants(kernel, d, is_causal, tiles), "num_warps": tiles.num_warps,
                 **{name: None for name, kind in arguments.items() if kind == "constexpr"}}
    kinds = {**arguments, **dict.fromkeys(constants, "constexpr")}
    signature = {name: kinds[name] for name in fn.arg_names}     # in the kernel's order
    # as the JIT specializes a launch: pointers 16-byte aligned (torch's allocations are) and
    # the sequence length a multiple of 16 (every length the benchmarks time)
    divisible = {(fn.arg_names.index(name),): [["tt.divisibility", 16]]
                 for name, kind in signature.items() if kind.startswith("*") or name == "seq"}
    compiled = triton.compile(GluonASTSource(fn, signature, constants, divisible),
                              target=GPUTarget("cuda", 90, 32), options=tiles.launch_options())
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    try:
        usage, sass = (subprocess.run([tool, flag, f.name], capture_output=True, text=True,
                                      check=True).stdout for flag in ("-res-usage", "-sass"))
    finally:
        os.unlink(f.name)
    # spilled registers live on the thread's stack (the driver's local size, Triton's n_spills
    # times 4), or in local memory
    fields = {name: int(value) for name, value in re.findall(r"(REG|STACK|LOCAL):(\d+)", usage)}
    # ptxas serializes a kernel's wgmmas where it cannot keep them in flight (its C7512 note,
    # which Triton does not show: "insufficient register resources"): then every HGMMA ends
    # its own group (gsb0) and is waited for at once, the products in flight lost
    products = re.findall(r"HGMMA\.[^;]*;", sass)
    return {"registers": fields["REG"], "spilled_bytes": fields["STACK"] + fields["LOCAL"],
            "shared_bytes": compiled.metadata.shared,
            "serialized_wgmma": bool(products) and all("gsb0" in p for p in products)}
