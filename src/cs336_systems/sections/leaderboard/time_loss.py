"""The leaderboard's LM head and loss alone: each way of taking them (ours chunked, the whole
logits as written, Liger's fused linear cross-entropy, Cut Cross-Entropy) on the same inputs at
the leaderboard's shape, in one process: time, memory, and agreement with the fp32 loss.

    python -m cs336_systems.sections.leaderboard.time_loss --shape 8b --tokens 32768 \
        --losses chunked whole-logits liger cut-cross-entropy --output r.json

A way whose package is not installed, or whose Triton kernels need CUDA, is a `skipped` row
with the reason; one that runs out of memory an `oom` row. Both leave the others measured.
"""

from __future__ import annotations

from cs336_systems.lm.loss import HEAD_LOSSES
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.sizes import LEADERBOARD_SHAPES
from cs336_systems.pipeline.cli import (
    non_negative_int,
    positive_int,
    record_run,
    section_parser,
)
from cs336_systems.sections.leaderboard.loss_timing import measure


def main(argv: list[str] | None = None) -> dict:
    parser = section_parser(__doc__)
    parser.add_argument("--shape", default="8b", choices=list(LEADERBOARD_SHAPES))
    parser.add_argument("--tokens", type=positive_int, default=32768,
                        help="tokens of the batch (one GPU's sequence)")
    parser.add_argument("--losses", nargs="+", choices=list(HEAD_LOSSES),
                        default=list(HEAD_LOSSES))
    parser.add_argument("--precision", default="bf16", choices=list(PRECISIONS),
                        help="the hidden states' and the head weight's dtype")
    parser.add_argument("--warmup-steps", type=non_negative_int, default=2)
    parser.add_argument("--measure-steps", type=positive_int, default=10)
    args = parser.parse_args(argv)
    return record_run("leaderboard_loss", args, measure)


if __name__ == "__main__":
    main()
