"""What every Gluon kernel of the package shares: the Triton-version shims, the constants,
the tiles' layouts, the TMA rings and their mbarriers, the programs' order over the grid, the
masks, and the row-wise loads and stores."""

from __future__ import annotations

import torch
import triton
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
)


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
