"""Sweep the Gluon FlashAttention kernels' tiles on a Hopper GPU: for each head dimension, every
candidate tile set of each kernel (the forward's four schedules; the backward's key-tile and
query-tile kernels, and the key-tile kernel that adds dQ atomically) with the others at their
defaults, each checked against the defaults' outputs before it is timed. `TILES` in
`kernels/flash_gluon/` comes from this (16 heads of 16384 causal bf16, on an H200).

    python scripts/sweep_gluon.py [--heads 16] [--seq 16384] [--kernels forward dq] [--json f]

One line per (d, kernel, tiles): the time of the pass it runs (forward, or the whole backward:
both of its kernels), or the error that stopped it (a tile set too large for shared memory).
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from cs336_systems.kernels import flash_gluon as fg
from cs336_systems.kernels.flash_gluon import Tiles

CANDIDATES = {
    "forward": {64: [Tiles(128, 128, 2, 8), Tiles(128, 64, 2, 8), Tiles(128, 64, 3, 8),
                     Tiles(64, 128, 2, 4), Tiles(64, 64, 2, 4), Tiles(64, 64, 3, 4)],
                128: [Tiles(128, 64, 2, 8), Tiles(128, 128, 2, 8), Tiles(128, 64, 3, 8),
                      Tiles(64, 64, 2, 4), Tiles(64, 128, 2, 4), Tiles(64, 64, 3, 4)]},
    "forward-overlap": {64: [Tiles(128, 128, 3, 8), Tiles(128, 64, 3, 8), Tiles(64, 64, 3, 4),
                             Tiles(64, 128, 3, 4)],
                        128: [Tiles(128, 64, 3, 8), Tiles(64, 64, 3, 4), Tiles(64, 128, 3, 4)]},
    # the warp-specialized forward: compute warps, ring slots and the registers they share
    "forward-specialized": {64: [Tiles(64, 128, 2, 4, 128), Tiles(64, 128, 3, 4, 128),
                                 Tiles(128, 128, 2, 8, 168), Tiles(64, 64, 3, 4, 128)],
                            128: [Tiles(128, 128, 2, 8, 168), Tiles(128, 64, 3, 8, 168),
                                  Tiles(64, 128, 2, 4, 128), Tiles(64, 64, 3, 4, 128)]},
    # the ping-pong forward: rows a consumer warpgroup, and its consumers (a query tile each):
    # two at 168 registers a thread at launch, three at 128
    "forward-pingpong": {64: [Tiles(64, 128, 3, 4, 128, 3), Tiles(64, 128, 4, 4, 128, 3),
                              Tiles(64, 64, 4, 4, 128, 3), Tiles(64, 128, 3, 4, 168, 2),
                              Tiles(64, 64, 3, 4, 168, 2)],
                         128: [Tiles(64, 128, 3, 4, 168, 2), Tiles(64, 128, 2, 4, 168, 2),
                               Tiles(64, 64, 3, 4, 168, 2), Tiles(64, 64, 4, 4, 168, 2)]},
    "dkdv": {64: [Tiles(64, 128, 2, 8), Tiles(128, 128, 2, 8), Tiles(64, 64, 2, 4),
                  Tiles(128, 64, 2, 4), Tiles(64, 64, 3, 4)],
             128: [Tiles(64, 64, 2, 4), Tiles(64, 64, 3, 4), Tiles(128, 64, 2, 4),
                   Tiles(64, 128, 2, 8), Tiles(32, 64, 2, 4)]},
    # the key-tile kernel adding dQ atomically (d 64 only: it spills at 128)
    "dkdv-atomic": {64: [Tiles(64, 64, 2, 4), Tiles(64, 64, 3, 4), Tiles(64, 128, 2, 8)]},
    # the warp-specialized one: block_n keys over two consumer warpgroups, with a loader warp and
    # a dQ warpgroup, 128 registers at launch (four warpgroups)
    "dkdv-specialized": {64: [Tiles(64, 128, 2, 4, 128), Tiles(64, 128, 3, 4, 128)]},
    # the same without the dQ warpgroup, each consumer adding half of dQ's columns (d 128); a
    # third ring slot just fits in shared memory
    "dkdv-paired": {128: [Tiles(64, 128, 2, 4, 168), Tiles(64, 128, 3, 4, 168)]},
    "dq": {64: [Tiles(128, 64, 2, 8), Tiles(128, 128, 2, 8), Tiles(64, 64, 2, 4),
                Tiles(64, 128, 2, 4), Tiles(64, 64, 3, 4)],
           128: [Tiles(64, 64, 2, 4), Tiles(128, 64, 2, 8), Tiles(64, 64, 3, 4),
                 Tiles(64, 128, 2, 4), Tiles(128, 128, 2, 8)]},
}
# d 80 and 96 (64 columns and a rest: `fg.head_split`) run in the waited forward and the split
# backward, and take d 128's candidates there
for _kernel in ("forward", "dq", "dkdv"):
    CANDIDATES[_kernel].update({d: CANDIDATES[_kernel][128] for d in (80, 96)})


def sweep(heads: int, seq: int, d: int, kernels: list[str]) -> list[dict]:
    torch.manual_seed(0)
    q, k, v, grad_o = (torch.randn(1, heads, seq, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(4))
    o, lse = fg.flash_gluon_forward(q, k, v, True)
    grads = fg.flash_gluon_backward(q, k, v, o, lse, grad_o, True)
    passes = {
        "forward": (lambda: fg.flash_gluon_forward(q, k, v, True), (o,)),
        "forward-overlap": (lambda: fg.flash_gluon_forward(q, k, v, True, "overlapped"), (o,)),
        "forward-specialized": (lambda: fg.flash_gluon_forward(q, k, v, True, "specialized"),
                                (o,)),
        "forward-pingpong": (lambda: fg.flash_gluon_forward(q, k, v, True, "pingpong"), (o,)),
        "dkdv": (lambda: fg.flash_gluon_backward(q, k, v, o, lse, grad_o, True, "split"), grads),
        "dq": (lambda: fg.flash_gluon_backward(q, k, v, o, lse, grad_o, True, "split"), grads),
        "dkdv-atomic": (lambda: fg.flash_gluon_backward(q, k, v, o, lse, grad_o, True, "atomic"),
                        grads),
        "dkdv-specialized": (lambda: fg.flash_gluon_backward(q, k, v, o, lse, grad_o, True,
                                                             "specialized"), grads),
        "dkdv-paired": (lambda: fg.flash_gluon_backward(q, k, v, o, lse, grad_o, True,
                                                        "paired"), grads),
    }
    rows = []
    for kernel in kernels:
        if d not in CANDIDATES[kernel]:
            continue
        run, expected = passes[kernel]
        default = fg.TILES[kernel][d]
        for tiles in CANDIDATES[kernel][d]:
            fg.TILES[kernel][d] = tiles
            row = {"d": d, "kernel": kernel, "tiles": tiles.__dict__, "default": tiles == default}
            try:
                got = run()
                got = got[:1] if kernel.startswith("forward") else got
                row["max_abs_diff"] = max((a.float() - b.float()).abs().max().item()
                                          for a, b in zip(got, expected))
                row["ms"] = do_bench(run, warmup=25, rep=100)
            except Exception as error:  # noqa: BLE001 - a tile set that does not fit is a row
                row["error"] = repr(error)[:200]
            finally:
                fg.TILES[kernel][d] = default
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--kernels", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES),
                        help="which kernels' candidates to time (default: all)")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args()
    rows = [row for d in fg.SUPPORTED_HEAD_DIMS
            for row in sweep(args.heads, args.seq, d, args.kernels)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
