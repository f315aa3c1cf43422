"""Sweep the fused AdamW kernel's launch shape on one GPU: for each (block, warps, chunk), the
median step time on a model's parameters, beside torch's fused AdamW and the copy bandwidth
measured in the same process. The kernel's defaults (kernels/adamw.py) come from this.

    python scripts/sweep_adamw.py --size 2.7b [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from cs336_systems.kernels.adamw import Plan
from cs336_systems.lm.model import MODEL_SIZES, build_model
from cs336_systems.measure.ceilings import copy_gbps
from cs336_systems.measure.timing import benchmark_ms

HYPER = dict(lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="2.7b", choices=list(MODEL_SIZES))
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--chunks", type=int, nargs="+", default=[65536, 262144])
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device("cuda")
    bandwidth = copy_gbps(device)
    params = list(build_model(args.size, context_length=16, device=device).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    count = sum(p.numel() for p in params)
    floor = count * 28 / (bandwidth * 1e9) * 1e3
    rows = []

    reference = torch.optim.AdamW(params, lr=1e-4, fused=True)
    reference.step()
    rows.append({"kernel": "torch fused", "ms": benchmark_ms(reference.step, device)})
    reference.state.clear()
    del reference
    torch.cuda.empty_cache()

    grads = [p.grad for p in params]
    moments = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    for chunk in args.chunks:
        plan = Plan(params, *moments, chunk=chunk)
        for block, warps in itertools.product(args.blocks, args.warps):
            if block > chunk:
                continue
            ms = benchmark_ms(lambda: plan.step(grads, step=10, block=block, num_warps=warps,
                                                **HYPER), device)
            rows.append({"kernel": f"ours chunk {chunk} block {block} warps {warps}", "ms": ms})
    print(f"{args.size}: {count:,} parameters, copy {bandwidth:.0f} GB/s, floor {floor:.2f} ms")
    torch_ms = rows[0]["ms"]
    for row in sorted(rows, key=lambda r: r["ms"]):
        print(f"{row['kernel']:40s} {row['ms']:8.3f} ms  {row['ms'] / floor:5.3f}x floor  "
              f"{row['ms'] / torch_ms:5.3f}x torch")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "parameters": count, "copy_gbps": bandwidth,
                       "floor_ms": floor, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
