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

The package, one idea a module: `common` (what every kernel shares: the tiles' layouts, the TMA
rings, the programs' order, the masks), `forward` (the forward's kernels, a schedule each),
`backward` (FlashAttention-2's backward kernels) and `backward_specialized` (the
warp-specialized one), `tiles` (each kernel's launch configuration and the schedules), `host`
(descriptors, launch plans and `flash_gluon_forward` / `flash_gluon_backward`), `operators` (the
custom operators and the autograd function) and `resources` (`compile_for_sm90`).
"""

from cs336_systems.kernels.flash_gluon.common import (
    L2_KV_BYTES,
    LOADER_WARPS,
    SUPPORTED_HEAD_DIMS,
    head_split,
)
from cs336_systems.kernels.flash_gluon.host import (
    check_inputs,
    flash_gluon_backward,
    flash_gluon_forward,
    unpermute_dq,
    unsupported_reason,
)
from cs336_systems.kernels.flash_gluon.operators import (
    FlashAttentionGluon,
    flash_gluon_bwd,
    flash_gluon_fwd,
)
from cs336_systems.kernels.flash_gluon.resources import compile_for_sm90
from cs336_systems.kernels.flash_gluon.tiles import (
    BACKWARD_SCHEDULES,
    DEFAULT_BACKWARD_SCHEDULES,
    DEFAULT_SCHEDULES,
    KERNEL_FUNCTIONS,
    KERNELS,
    SCHEDULES,
    SPILLED_BYTES,
    TILES,
    Tiles,
    default_backward_schedule,
    default_schedule,
)

__all__ = [
    "BACKWARD_SCHEDULES", "DEFAULT_BACKWARD_SCHEDULES", "DEFAULT_SCHEDULES", "KERNEL_FUNCTIONS",
    "KERNELS",
    "L2_KV_BYTES", "LOADER_WARPS", "SCHEDULES", "SPILLED_BYTES", "SUPPORTED_HEAD_DIMS", "TILES",
    "FlashAttentionGluon", "Tiles", "check_inputs", "compile_for_sm90", "default_backward_schedule",
    "default_schedule", "flash_gluon_backward", "flash_gluon_bwd", "flash_gluon_fwd",
    "flash_gluon_forward", "head_split", "unpermute_dq", "unsupported_reason",
]
