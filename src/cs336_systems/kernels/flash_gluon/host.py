"""The host side: what the kernels take (`unsupported_reason`), their TMA descriptors (cached
by address), launch plans (made once a shape), the dQ accumulator, and `flash_gluon_forward` and
`flash_gluon_backward`."""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.experimental.gluon import language as gl

from cs336_systems.kernels.flash_gluon.common import (
    GL_DTYPES, LOG2_E, SUPPORTED_HEAD_DIMS, _DESCRIBED, _block_rows, head_split,
)
from cs336_systems.kernels.flash_gluon.tiles import (
    BACKWARD_SCHEDULES, SCHEDULES, TILES, Tiles, KERNEL_FUNCTIONS, _O_BY_TMA, _QUERY_TILE_KERNELS,
    _SPLIT_D_KERNELS, default_backward_schedule, default_schedule,
)
from cs336_systems.kernels.launch import DeviceAddress, Launch, direct


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
    direct(KERNEL_FUNCTIONS[kernel])[plan.grid](*args, **plan.kwargs)


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
