"""Sweep the Triton FlashAttention-2 kernels' launch tiles on one GPU, beside SDPA's flash and
cuDNN backends timed in the same process: for each shape, every forward tile set and every
backward tile set (atomic dQ and the deterministic two-kernel dQ), then the dQ kernel's tiles
under the fastest key-tile kernel's, each checked against SDPA before it is timed. The tiles in
`kernels/flash_triton.py` come from this.

    python scripts/sweep_flash.py [--shapes 16x1x16384x64 ...] [--json out.json]

A shape is batch x heads x seq x d (bf16, causal unless --not-causal); `fp32:` before one sweeps
the fp32 forward at each precision.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from cs336_systems.kernels import flash_triton as ft
from cs336_systems.kernels.flash_triton import Tiles
from cs336_systems.kernels.launch import direct

SHAPES = ["16x1x16384x64", "16x1x16384x128", "16x1x4096x64", "1x1x65536x64", "4x32x512x80",
          "4x16x1024x64", "4x16x2048x128", "48x1x1000x64", "1x1x4096x64", "1x1x4096x128",
          "fp32:16x1x4096x64"]
FORWARD = [Tiles(128, 64, 8, 3), Tiles(128, 64, 8, 2), Tiles(128, 64, 8, 4), Tiles(128, 128, 8, 2),
           Tiles(128, 128, 8, 3), Tiles(128, 64, 4, 3), Tiles(128, 32, 4, 3), Tiles(64, 64, 4, 3),
           Tiles(64, 64, 4, 4), Tiles(64, 32, 4, 3)]
# (key-tile kernel, dQ kernel); the dQ kernel's tiles matter only without atomics
BACKWARD = [Tiles(64, 128, 8, 2), Tiles(32, 128, 4, 2), Tiles(32, 128, 8, 2), Tiles(64, 128, 8, 3),
            Tiles(64, 64, 4, 2), Tiles(64, 64, 4, 3), Tiles(32, 64, 4, 3), Tiles(128, 128, 8, 2)]
DQ = Tiles(128, 64, 8, 3)
DQ_TILES = [DQ, Tiles(128, 64, 8, 2), Tiles(128, 64, 4, 3), Tiles(128, 32, 8, 3),
            Tiles(128, 128, 8, 2), Tiles(64, 64, 4, 3), Tiles(64, 32, 4, 3)]
FP32 = {"ieee": [Tiles(32, 32, 4, 2), Tiles(64, 32, 4, 2)],
        "tf32": [Tiles(64, 32, 4, 2), Tiles(64, 64, 4, 2), Tiles(128, 64, 8, 2),
                 Tiles(64, 64, 4, 3), Tiles(128, 32, 8, 2)],
        "tf32x3": [Tiles(64, 32, 4, 2), Tiles(64, 64, 4, 2), Tiles(128, 64, 8, 2),
                   Tiles(64, 32, 4, 3)]}


def sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def flops(shape, causal, passes):
    batch, heads, seq, d = shape
    return 4 * batch * heads * seq * seq * d * passes * (0.5 if causal else 1.0)


def close(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def sweep(spec: str, causal: bool) -> list[dict]:
    fp32 = spec.startswith("fp32:")
    shape = tuple(int(x) for x in spec.removeprefix("fp32:").split("x"))
    dtype = torch.float32 if fp32 else torch.bfloat16
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad_o = torch.randn_like(q)
    rows = []

    def row(impl, config, fwd_ms, bwd_ms=None, error=None):
        entry = {"shape": spec, "causal": causal, "impl": impl, "config": config,
                 "forward_ms": fwd_ms, "error": error,
                 "forward_tflops": flops(shape, causal, 1) / fwd_ms / 1e9}
        if bwd_ms is not None:
            entry.update(backward_ms=bwd_ms, total_ms=fwd_ms + bwd_ms,
                         total_tflops=flops(shape, causal, 3.5) / (fwd_ms + bwd_ms) / 1e9)
        rows.append(entry)
        print(json.dumps(entry), flush=True)

    with torch.no_grad():
        reference = sdpa(SDPBackend.MATH)(q.double(), k.double(), v.double(), causal) if (
            shape[2] <= 4096 and math.prod(shape) <= 2**24) else None
    if not fp32:
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            run = sdpa(backend)
            try:
                fwd = do_bench(lambda: run(q, k, v, causal))
                out = run(q, k, v, causal)
                total = do_bench(lambda: torch.autograd.grad(run(q, k, v, causal), (q, k, v),
                                                            grad_o))
                row(name, "", fwd, total - fwd)
            except RuntimeError as error:
                print(name, "cannot run:", str(error).splitlines()[0])
        if reference is None:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        ref_grads = torch.autograd.grad(sdpa(SDPBackend.FLASH_ATTENTION)(q, k, v, causal),
                                        (q, k, v), grad_o)
    precisions = FP32 if fp32 else {"bf16": FORWARD}
    best = None
    for label, configs in precisions.items():
        precision = label if fp32 else ft.DEFAULT_FP32_PRECISION  # 16-bit dots ignore it
        for tiles in configs:
            try:
                o, lse = ft._flash_fwd(q, k, v, causal, precision, wrap=direct,
                                       tiles=tiles)
                error = close(o, reference)
                fwd = do_bench(lambda: ft._flash_fwd(q, k, v, causal, precision,
                                                     wrap=direct, tiles=tiles))
            except Exception as exc:  # noqa: BLE001 - a config that fails to compile
                print(label, tiles, "failed:", str(exc).splitlines()[0][:200])
                continue
            row(f"ours-{label}", list(tiles), fwd, error=error)
            if best is None or fwd < best[0]:
                best = (fwd, tiles, o, lse)
    if fp32:
        return rows
    _, fwd_tiles, o, lse = best

    def time_backward(tiles: tuple[Tiles, Tiles], atomic: bool) -> float | None:
        def backward():
            return ft._flash_bwd(q, k, v, o, lse, grad_o, causal, ft.DEFAULT_FP32_PRECISION,
                                 atomic_dq=atomic, wrap=direct, tiles=tiles)
        try:
            grads = backward()
            error = max(close(g, r) for g, r in zip(grads, ref_grads))
            bwd = do_bench(backward)
        except Exception as exc:  # noqa: BLE001
            print("backward", tiles, "failed:", str(exc).splitlines()[0][:200])
            return None
        row("ours-atomic" if atomic else "ours-deterministic",
            [list(fwd_tiles), *(list(t) for t in tiles[:2 if not atomic else 1])],
            best[0], bwd, error)
        return bwd

    for tiles in BACKWARD:
        time_backward((tiles, DQ), atomic=True)
    deterministic = {tiles: time_backward((tiles, DQ), atomic=False) for tiles in BACKWARD}
    timed = [tiles for tiles, ms in deterministic.items() if ms is not None]
    if timed:  # the dQ kernel's tiles, under the fastest key-tile kernel's
        keys = min(timed, key=deterministic.get)
        for dq in DQ_TILES:
            if dq != DQ:
                time_backward((keys, dq), atomic=False)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--not-causal", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [r for spec in args.shapes for r in sweep(spec, not args.not_causal)]
    print(f"\n{'shape':22} {'impl':20} {'fwd ms':>8} {'total ms':>9} {'TFLOP/s':>8}  config")
    for spec in args.shapes:
        mine = [r for r in rows if r["shape"] == spec]
        for impl in sorted({r["impl"] for r in mine}):
            best = min((r for r in mine if r["impl"] == impl),
                       key=lambda r: r.get("total_ms", r["forward_ms"]))
            total = best.get("total_ms")
            rate = best.get("total_tflops", best["forward_tflops"])
            print(f"{spec:22} {impl:20} {best['forward_ms']:8.3f} "
                  f"{total if total is not None else float('nan'):9.3f} {rate:8.1f}  "
                  f"{best['config']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
