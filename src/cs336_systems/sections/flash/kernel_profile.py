"""Where one forward+backward of attention spends its GPU time, kernel by kernel: our
FlashAttention-2 (its deterministic backward, and the variant that adds dQ atomically) beside
SDPA's cuDNN and flash backends, at one shape, in one process.

    python -m cs336_systems.sections.flash.kernel_profile --shape 16x16384x128 --precision bf16 \
        --output r.json

How it profiles: `kernel_timings`; the variants and how work is counted: `kernel_variants`.
"""

from __future__ import annotations

import argparse

from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.pipeline.cli import (
    parsed_config,
    positive_float,
    positive_int,
    record_run,
    section_parser,
)
from cs336_systems.sections.flash.kernel_timings import measure
from cs336_systems.sections.flash.targets import parse_shape


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--shape", required=True, type=parse_shape, help="BATCHxSEQxD")
    parser.add_argument("--precision", required=True, choices=list(PRECISIONS))
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--steps", type=positive_int, default=5,
                        help="profiled forward+backward steps per variant")
    parser.add_argument("--sustain-s", type=positive_float, default=3.0,
                        help="seconds of back-to-back steps per variant under the GPU sampler")
    args = parser.parse_args(argv)
    config = {**parsed_config(args), "shape": list(args.shape)}
    return record_run("flash_kernels", args, measure, config)


if __name__ == "__main__":
    main()
