"""One compiled forward+backward of our FlashAttention-2, for `flash_speed`'s cold_compile group.

    TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) \
        python -m cs336_systems.sections.flash.cold_compile --shape 16x16384x64 --precision bf16

`flash_speed` runs this in a fresh process with empty caches and times the whole process, from
its start (Python, torch and the kernels imported) to its end; this prints one JSON line with
the part after the imports, `first_step_s`: torch.compile, Triton's compilation of each
kernel, and the first forward and backward to their end on the device. It writes no record.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.sections.flash.speed import first_compiled_step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, help="BATCHxSEQxD")
    parser.add_argument("--precision", required=True, choices=list(PRECISIONS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    shape = tuple(int(n) for n in args.shape.split("x"))
    first_compiled_step(shape, PRECISIONS[args.precision], torch.device(args.device), args.causal)
    parts = {"first_step_s": time.perf_counter() - start}
    print(json.dumps(parts), flush=True)
    return parts


if __name__ == "__main__":
    main()
