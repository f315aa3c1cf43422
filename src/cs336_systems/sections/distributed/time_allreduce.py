"""distributed_communication_single_node (§4.1): all-reduce latency and bandwidth.

    python -m cs336_systems.sections.distributed.time_allreduce --backend nccl --size-mb 100 \
        --world-size 2 --output r.json

float32 tensors of `size_mb` MB (10^6 bytes); `warmup_steps` untimed all-reduces, then `measure_steps`
timed ones, each between two device synchronizations (the timing harness). Every rank's times
are gathered; an
iteration's time is the slowest rank's. Algorithm bandwidth = bytes / time; bus bandwidth
= algorithm bandwidth * 2 (n - 1) / n, what each link carries in a ring all-reduce.
"""

from __future__ import annotations

from cs336_systems.distributed.launch import BACKENDS
from cs336_systems.pipeline.cli import non_negative_int, parsed_config, positive_int, section_parser
from cs336_systems.pipeline.torchrun import launch_or_work
from cs336_systems.sections.distributed.allreduce_timing import work


def main(argv: list[str] | None = None) -> None:
    parser = section_parser(__doc__)
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--size-mb", type=float, required=True)
    parser.add_argument("--world-size", type=positive_int, required=True)
    parser.add_argument("--warmup-steps", type=non_negative_int, default=5)
    parser.add_argument("--measure-steps", type=positive_int, default=20)
    args = parser.parse_args(argv)
    if args.size_mb <= 0:
        parser.error(f"--size-mb must be positive, got {args.size_mb}")
    config = parsed_config(args)
    launch_or_work("cs336_systems.sections.distributed.time_allreduce", "allreduce", config, args.output, work,
                   args.world_size, args.backend, argv)


if __name__ == "__main__":
    main()

