"""One training step of the 2026 leaderboard (assignment section 8) in one variant of
`runs.VARIANTS`: forward, loss, backward and AdamW, bf16 compute over fp32 weights and
optimizer state, one sequence per GPU, timed.

    python -m cs336_systems.sections.leaderboard.time_leaderboard --variant ours --shape 8b \
        --layers 17 --context-length 32768 --world-size 1 --output r.json

With `--world-size 1` the step runs in this process on one device, nothing sharded (the proxy
of one GPU's share when `--layers` is below the shape's). With more, torchrun starts one
process per GPU and every run is sharded the same way, torch's FSDP2 on each layer and on the
root (parameters gathered in bf16, gradients reduced in fp32); a machine with fewer GPUs
records `skipped`.

Before timing, the job checks the step's input/output behaviour at the full model shape on
`--check-tokens` tokens a sequence: the loss and gradients of this run's levers against the
model as written (nothing recomputed, SDPA, whole logits), both eager, the same weights and
batch. Then `--warmup-steps` steps (compilation happens there) and `--measure-steps` timed
steps. With `--cold-caches` the compilers' on-disk caches start empty, so that the record's
`wall_s` (this process's start to the record) is the leaderboard's from-empty-caches time.
Over the timed steps the GPU's clock and power are sampled (`measure.gpu_state`); with
`--profile`, one more step runs under torch.profiler and the record holds its device time by
class of kernel (`measure.profiling.time_by_class`): where the step's time went.
"""

from __future__ import annotations

import argparse
import os

from cs336_systems.distributed.launch import backend_for
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.sizes import LEADERBOARD_SHAPES
from cs336_systems.pipeline.cli import (
    non_negative_int,
    parsed_config,
    positive_int,
    record_run,
    section_parser,
)
from cs336_systems.pipeline.torchrun import launch_or_work
from cs336_systems.sections.leaderboard.runs import VARIANTS
from cs336_systems.sections.leaderboard.step_timing import (
    empty_caches,
    measure,
    skip_reason,
    work,
)

MODULE = "cs336_systems.sections.leaderboard.time_leaderboard"  # torchrun starts it again


def main(argv: list[str] | None = None) -> None:
    parser = section_parser(__doc__)
    parser.add_argument("--variant", required=True, choices=list(VARIANTS))
    parser.add_argument("--shape", default="8b", choices=list(LEADERBOARD_SHAPES))
    parser.add_argument("--layers", type=positive_int, default=None,
                        help="layers of the model (default: the shape's; fewer: a proxy)")
    parser.add_argument("--context-length", type=positive_int, default=32768,
                        help="tokens of each GPU's one sequence")
    parser.add_argument("--world-size", type=positive_int, default=2)
    parser.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    parser.add_argument("--check-tokens", type=non_negative_int, default=4096,
                        help="tokens a sequence of the input/output check (0: no check)")
    parser.add_argument("--warmup-steps", type=non_negative_int, default=2)
    parser.add_argument("--measure-steps", type=positive_int, default=5)
    parser.add_argument("--cold-caches", action=argparse.BooleanOptionalAction, default=False,
                        help="start with empty torch.compile and Triton caches")
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=False,
                        help="profile one more step: its device time by class of kernel")
    args = parser.parse_args(argv)
    spec = LEADERBOARD_SHAPES[args.shape]
    for option, value in (("--context-length", args.context_length),
                          ("--check-tokens", args.check_tokens)):
        if value > spec.max_context_length:
            parser.error(f"{option} {value} exceeds shape {args.shape!r}'s "
                         f"{spec.max_context_length} tokens")
    config = {**parsed_config(args), "backend": backend_for(args.device)}
    with empty_caches(args.cold_caches and "LOCAL_RANK" not in os.environ):
        if args.world_size == 1 or skip_reason(VARIANTS[args.variant], config):
            record_run("leaderboard", args, measure, config)
        else:
            launch_or_work(MODULE, "leaderboard", config, args.output, work, args.world_size,
                           config["backend"], argv, timeout_s=900)

if __name__ == "__main__":
    main()

