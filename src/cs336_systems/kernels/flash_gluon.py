"""FlashAttention-2's forward for Hopper (sm90) in Gluon, Triton's lower-level language:
the tiles' shared memory, the TMA loads of K and V into a ring of STAGES buffers with an
mbarrier each, and `warpgroup_mma` (wgmma) for S = Q K^T and O += P V are written out, where
`tl` leaves them to the compiler. Issue 48 builds on it (warp specialization, the backward);
until the backward exists it is not an attention choice of `lm.attention`.

    o, lse = flash_gluon_forward(q, k, v, is_causal)   # (batch, heads, seq, d), bf16 or fp16

q, k and v share one shape (self-attention, no grouped heads), d is 64 or 128
(`SUPPORTED_HEAD_DIMS`), any seq. The causal mask is SDPA's `is_causal=True`, as in
`kernels.flash_triton`: query i sees keys 0..i. o has q's shape; lse (batch, heads, seq) fp32 is
each row's logsumexp of the scaled scores, in natural log, as the Triton kernel saves it.

Program roles: program (m, bh) owns BLOCK_M query rows of one (batch, head); its num_warps warps
are num_warps // 4 warpgroups, which split the rows of each wgmma. The TMA descriptors see q, k
and v as 2-D (batch * heads * seq, d) tensors: a tile that runs past its head's last row reads
the next head's rows (zeros past the tensor's end); the key mask (keys >= seq) and the masked
store of o make them harmless. Key tiles wholly before the diagonal and inside the sequence
run without a mask; the others (the diagonal band, the sequence's tail) with one.

`compile_for_sm90` compiles a configuration for sm90a on any machine (no GPU needed) and
returns what ptxas allotted: registers, spilled bytes, shared memory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from cs336_systems.kernels.checks import triton_interpreting

# Triton 3.6 (torch 2.11's) names the TMA load async_copy_global_to_shared, later ones async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

LOG2_E = 1.4426950408889634
LN_2 = gl.constexpr(0.6931471805599453)
SUPPORTED_HEAD_DIMS = (64, 128)
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


@gluon.jit
def _issue_kv(k_desc, v_desc, k_smem, v_smem, ready, row, tile, STAGES: gl.constexpr):
    """Start the TMA loads of K and V tile `tile` (rows `row`..) into ring slot tile % STAGES;
    ready[slot] completes when both have landed."""
    slot = tile % STAGES
    bar = ready.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [row, 0], bar, k_smem.index(slot))
    _tma_load(v_desc, [row, 0], bar, v_smem.index(slot))


@gluon.jit
def _attend_tile(q_smem, k_tile, v_tile, acc, m_i, l_i, start_m, start_n, seq, qk_scale,
                 s_layout: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, MASK: gl.constexpr,
                 CAUSAL: gl.constexpr):
    """One K/V tile of the online softmax (FA-2, Algorithm 1, lines 8-10), scores in base 2."""
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    s = s * qk_scale
    if MASK:  # the diagonal tile of a causal program, or the keys past the sequence's end
        cols = start_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        keep = cols[None, :] < seq
        if CAUSAL:
            rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, s_layout))
            keep = keep & (cols[None, :] <= rows[:, None])
        s = gl.where(keep, s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p16 = gl.convert_layout(p.to(v_tile.dtype), p_layout)
    acc = warpgroup_mma(p16, v_tile, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, m_new, l_i


@gluon.jit
def attention_fwd_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, seq, qk_scale,
                         HEAD_D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    pid_m = gl.program_id(0)            # which BLOCK_M rows of the sequence
    bh = gl.program_id(1)               # which (batch, head)
    head_row = bh * seq                 # the head's first row in the 2-D views
    start_m = pid_m * BLOCK_M
    dtype: gl.constexpr = q_desc.dtype

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_ready.index(i), count=1)

    mbarrier.expect(q_ready, q_desc.block_type.nbytes)
    _tma_load(q_desc, [head_row + start_m, 0], q_ready, q_smem)

    # the keys this program reads: up to its last row when causal (FA-2's early exit)
    if CAUSAL:
        hi = gl.minimum(seq, start_m + BLOCK_M)
    else:
        hi = seq
    n_tiles = gl.cdiv(hi, BLOCK_N)
    # tiles whose every key is visible to every row, and inside the sequence: no mask
    if CAUSAL:
        n_full = gl.minimum(start_m // BLOCK_N, seq // BLOCK_N)
    else:
        n_full = seq // BLOCK_N

    for i in gl.static_range(STAGES - 1):               # the ring's prologue
        if i < n_tiles:
            _issue_kv(k_desc, v_desc, k_smem, v_smem, kv_ready, head_row + i * BLOCK_N, i,
                      STAGES)

    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    mbarrier.wait(q_ready, 0)

    for j in range(n_tiles):
        # refill the slot that tile j - 1 used (its wgmmas have completed) with tile j + S - 1
        nxt = j + STAGES - 1
        if nxt < n_tiles:
            _issue_kv(k_desc, v_desc, k_smem, v_smem, kv_ready, head_row + nxt * BLOCK_N, nxt,
                      STAGES)
        slot = j % STAGES
        mbarrier.wait(kv_ready.index(slot), (j // STAGES) & 1)
        if j < n_full:
            acc, m_i, l_i = _attend_tile(q_smem, k_smem.index(slot), v_smem.index(slot), acc,
                                         m_i, l_i, start_m, j * BLOCK_N, seq, qk_scale,
                                         s_layout, p_layout, o_layout, BLOCK_M, BLOCK_N,
                                         False, CAUSAL)
        else:
            acc, m_i, l_i = _attend_tile(q_smem, k_smem.index(slot), v_smem.index(slot), acc,
                                         m_i, l_i, start_m, j * BLOCK_N, seq, qk_scale,
                                         s_layout, p_layout, o_layout, BLOCK_M, BLOCK_N,
                                         True, CAUSAL)

    mbarrier.invalidate(q_ready)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_ready.index(i))

    _store_outputs(o_ptr, lse_ptr, acc, m_i, l_i, head_row, start_m, seq, o_layout, s_layout,
                   HEAD_D, BLOCK_M)


@gluon.jit
def _store_outputs(o_ptr, lse_ptr, acc, m_i, l_i, head_row, start_m, seq,
                   o_layout: gl.constexpr, s_layout: gl.constexpr, HEAD_D: gl.constexpr,
                   BLOCK_M: gl.constexpr):
    """Lines 12-13: O = acc / l and the logsumexp in natural log (what the backward reads), the
    rows past the sequence's end left unwritten."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    o = (acc / l_o[:, None]).to(o_ptr.dtype.element_ty)
    rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, HEAD_D, gl.SliceLayout(0, o_layout))
    offsets = (head_row + rows)[:, None] * HEAD_D + cols[None, :]
    gl.store(o_ptr + offsets, o, mask=(rows < seq)[:, None])
    lse_rows = start_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, s_layout))
    lse = (m_i + gl.log2(l_i)) * LN_2
    gl.store(lse_ptr + head_row + lse_rows, lse, mask=lse_rows < seq)


@dataclass(frozen=True)
class Tiles:
    """One launch configuration: query rows and keys per tile, K/V ring slots, warps."""

    block_m: int = 128
    block_n: int = 128
    stages: int = 2
    num_warps: int = 8


# per head dim: d 128 with 128-key tiles holds 164 KB of shared memory and 220 registers a
# thread (compile_for_sm90); 64-key tiles leave room for a second program per SM
TILES = {64: Tiles(block_n=128), 128: Tiles(block_n=64)}


def _shared_layout(block: list[int], dtype) -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """What the kernel runs on, each failure saying what is supported."""
    if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one (batch, heads, seq, d) shape; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"the Gluon kernel supports d in {SUPPORTED_HEAD_DIMS}; got "
                         f"{q.shape[-1]} (kernels.flash_triton takes any d up to 256)")
    if q.dtype not in GL_DTYPES or len({q.dtype, k.dtype, v.dtype}) != 1:
        raise ValueError(f"q, k, v must share one dtype of bfloat16, float16; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        raise ValueError(f"the Gluon kernel runs on a Hopper GPU (sm90); got {q.device}")


def flash_gluon_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """o and the logsumexp of softmax(q k^T / sqrt(d)) v, one launch (see the module)."""
    check_inputs(q, k, v)
    batch, heads, seq, d = q.shape
    tiles = TILES[d]
    rows = batch * heads * seq
    q2, k2, v2 = (t.contiguous().view(rows, d) for t in (q, k, v))
    o = torch.empty_like(q2)
    lse = torch.empty((batch, heads, seq), dtype=torch.float32, device=q.device)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    dtype = GL_DTYPES[q.dtype]

    def descriptor(t, block_rows):
        block = [block_rows, d]
        return TensorDescriptor(t, [rows, d], [d, 1], block, _shared_layout(block, dtype))

    grid = (triton.cdiv(seq, tiles.block_m), batch * heads)
    attention_fwd_kernel[grid](
        descriptor(q2, tiles.block_m), descriptor(k2, tiles.block_n),
        descriptor(v2, tiles.block_n), o, lse, seq, d ** -0.5 * LOG2_E,
        HEAD_D=d, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, STAGES=tiles.stages,
        CAUSAL=is_causal, num_warps=tiles.num_warps)
    return o.view(q.shape), lse


def compile_for_sm90(d: int, is_causal: bool, tiles: Tiles | None = None,
                     dtype: torch.dtype = torch.bfloat16) -> dict:
    """Compile the forward for sm90a here (no GPU needed): its registers a thread, bytes
    spilled to local memory and bytes of shared memory, from the cubin. Where this process runs
    Triton's interpreter (a CPU machine: `kernels` turns it on), in a child process without it:
    Gluon kernels compile, they do not interpret."""
    tiles = tiles or TILES[d]
    if not triton_interpreting():
        return _resource_usage(d, is_causal, tiles, dtype)
    call = (f"import json, torch; from {__name__} import Tiles, _resource_usage; "
            f"print(json.dumps(_resource_usage({d}, {is_causal}, {tiles!r}, {dtype})))")
    done = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True,
                          check=False, env={**os.environ, "TRITON_INTERPRET": "0"})
    if done.returncode != 0:
        raise RuntimeError(f"compiling the Gluon forward for sm90a failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def _resource_usage(d: int, is_causal: bool, tiles: Tiles, dtype: torch.dtype) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]

    def descriptor(block_rows):
        block = [block_rows, d]
        return f"tensordesc<{name}[{block_rows}, {d}],{_shared_layout(block, GL_DTYPES[dtype])!r}>"

    signature = {"q_desc": descriptor(tiles.block_m), "k_desc": descriptor(tiles.block_n),
                 "v_desc": descriptor(tiles.block_n), "o_ptr": f"*{name}", "lse_ptr": "*fp32",
                 "seq": "i32", "qk_scale": "fp32"}
    constants = {"HEAD_D": d, "BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n,
                 "STAGES": tiles.stages, "CAUSAL": is_causal, "num_warps": tiles.num_warps}
    signature.update({key: "constexpr" for key in constants})
    kernel = triton.compile(GluonASTSource(attention_fwd_kernel, signature, constants),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": tiles.num_warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    try:
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    finally:
        os.unlink(f.name)
    fields = dict(re.findall(r"(REG|LOCAL):(\d+)", usage))
    return {"registers": int(fields["REG"]), "spilled_bytes": int(fields["LOCAL"]),
            "shared_bytes": kernel.metadata.shared}
