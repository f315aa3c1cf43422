"""flash_benchmarking (assignment §4.4-4.5): latency of one attention implementation at one shape.

    python -m cs336_systems.sections.flash.time_flash --attention flash-triton --seq 4096 --d 64 \
        --precision bf16 --output r.json [--batch-size 16 --compile]   # the leaderboard adds these

Times forward, backward and forward+backward with `triton.testing.do_bench` (median, ms).
`--attention` names an implementation of the attention registry (`cs336_systems.lm.attention`):
`flash-triton` (our FlashAttention-2 kernels), `flash-pytorch` (our tiled PyTorch version),
`eager` (softmax(q k^T / sqrt(d)) v in plain PyTorch ops), `sdpa` (torch's
scaled_dot_product_attention, its record naming the backend SDPA's dispatch chose) and
`sdpa-flash` / `sdpa-cudnn` (SDPA pinned to one backend; a
backend that cannot run the inputs here records `skipped` with SDPA's reason). On a CPU the
Triton kernels run under TRITON_INTERPRET=1, which `cs336_systems.kernels` sets where
there is no CUDA device.
"""

from __future__ import annotations

import argparse

from cs336_systems.kernels.checks import MAX_HEAD_DIM  # on a CPU: TRITON_INTERPRET=1
from cs336_systems.lm.attention import ATTENTION_IMPLEMENTATIONS
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.pipeline.cli import positive_int, record_run, section_parser
from cs336_systems.sections.flash.latency import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--attention", required=True, choices=list(ATTENTION_IMPLEMENTATIONS))
    parser.add_argument("--seq", type=positive_int, required=True)
    parser.add_argument("--d", type=positive_int, required=True)
    parser.add_argument("--precision", required=True, choices=list(PRECISIONS))
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                        help="time torch.compile(the implementation), as the leaderboard does")
    args = parser.parse_args(argv)
    if not 1 <= args.d <= MAX_HEAD_DIM:
        parser.error(f"--d must be from 1 to {MAX_HEAD_DIM}, got {args.d}")
    return record_run("flash", args, measure)


if __name__ == "__main__":
    main()
