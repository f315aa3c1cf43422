"""Each kernel's launch configuration (`Tiles`, `TILES`: an H200's fastest), the schedules
that pick the kernels, and which kernel each name of `KERNELS` runs."""

from __future__ import annotations

from dataclasses import dataclass

from cs336_systems.kernels.flash_gluon.backward import (
    attention_delta_kernel, attention_dkdv_kernel, attention_dq_kernel,
)
from cs336_systems.kernels.flash_gluon.backward_specialized import (
    attention_dkdv_specialized_kernel,
)
from cs336_systems.kernels.flash_gluon.forward import _FORWARD_KERNELS

# the backward's kernels of KERNELS (the key-tile kernel with dQ added atomically or not)
_BACKWARD_KERNELS = {"dq": attention_dq_kernel, "dkdv": attention_dkdv_kernel,
                     "dkdv-atomic": attention_dkdv_kernel,
                     "dkdv-specialized": attention_dkdv_specialized_kernel,
                     "dkdv-paired": attention_dkdv_specialized_kernel,
                     "delta": attention_delta_kernel}
# the kernel each name of KERNELS runs
KERNEL_FUNCTIONS = {**_FORWARD_KERNELS, **_BACKWARD_KERNELS}


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
    # 240 (PINGPONG_REGISTERS). One program an SM: 225 KiB of shared memory with two dQ buffers
    # a consumer (`_dq_store`), 1.6 KiB short of an SM's. With one, three slots (225 KiB) were
    # slower than two in one process: 5.35 against 5.23 ms of backward at 16 x 16384, 0.456
    # against 0.448 at 16 x 4096
    "dkdv-paired": {128: Tiles(block_m=64, block_n=128, num_warps=4, max_registers=168)},
    # block_m rows a program
    "delta": {64: Tiles(block_m=64, num_warps=4), 128: Tiles(block_m=64, num_warps=4)},
}
# bytes a thread spills (`compile_for_sm90`) where the fastest tiles spill at all: the
# three-consumer forward at d 64, whose consumers keep 160 registers a thread. ptxas keeps the
# mask's key columns out of registers, stored once a program and reloaded only in the tiles that
# take the mask (40 bytes under Triton 3.6, 80 under 3.9); the times above include them
SPILLED_BYTES = {("forward-pingpong", 64): 80,
                 # the paired backward, whose consumers keep 240: none under Triton 3.6 (the
                 # H200's, where its dQ one tile late was measured); under 3.9 ptxas keeps ten
                 # or so of the loop's scalars (addresses) on the stack, reloaded once a tile
                 ("dkdv-paired", 128): 112}
# d 80 and 96 (`head_split`: 64 columns and a rest) take d 128's tiles, in the kernels that take
# them (`_SPLIT_D_KERNELS`, the waited forward and the split backward). Replayed from CUDA graphs
# on an H200, the step (forward and backward) at d 128's forward and dQ tiles took 0.852x and
# 0.837x cuDNN's time at 32 x 2048 x 80 (d 64's: 0.857x), 0.910x and 0.881x at 128 x 512 x 80
# (0.916x) and 0.907x and 0.903x at 32 x 2048 x 96 (0.919x), each tried alone
# (docs/measurements.md, "Head dims of 80 and 96")
for _kernel in ("forward", "dq", "dkdv"):
    TILES[_kernel].update({d: TILES[_kernel][128] for d in (80, 96)})
