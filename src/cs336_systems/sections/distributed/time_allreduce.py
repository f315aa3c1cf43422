"""distributed_communication_single_node (§4.1): all-reduce latency and bandwidth.

    python -m cs336_systems.sections.distributed.time_allreduce --backend nccl --size-mb 100 \
        --world-size 2 --output r.json

float32 tensors of `size_mb` MB (10^6 bytes); `warmup` untimed all-reduces, then `iterations`
timed ones, each between two device synchronizations (the timing harness). Every rank's times
are gathered; an
iteration's time is the slowest rank's. Algorithm bandwidth = bytes / time; bus bandwidth
= algorithm bandwidth * 2 (n - 1) / n, what each link carries in a ring all-reduce.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.distributed as dist

from cs336_systems.distributed.launch import BACKENDS
from cs336_systems.measure.timing import summarize, time_phases
from cs336_systems.pipeline.cli import (
    add_common_arguments,
    non_negative_int,
    positive_int,
)
from cs336_systems.pipeline.torchrun import launch_or_work


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    size_bytes = int(config["size_mb"] * 1e6)
    torch.manual_seed(config["seed"] + rank)
    tensor = torch.randn(size_bytes // 4, device=device)
    phases = [("allreduce", lambda: dist.all_reduce(tensor)),
              ("rescale", lambda: tensor.div_(world_size))]  # keeps the values bounded
    times = time_phases(phases, device, config["warmup"], config["iterations"], total_name=None)
    times_ms = times.measured_ms["allreduce"]
    per_rank: list[list[float]] = [None] * world_size  # type: ignore[list-item]
    dist.all_gather_object(per_rank, times_ms)
    slowest = [max(ranks) for ranks in zip(*per_rank)]
    stats = summarize(slowest)
    seconds = stats["median"] / 1e3
    algbw = size_bytes / seconds / 1e9
    return {
        **{f"allreduce_ms_{k}": v for k, v in stats.items()},
        "allreduce_ms_samples": slowest,
        "rank_mean_ms": [statistics.fmean(t) for t in per_rank],
        "size_bytes": size_bytes,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (world_size - 1) / world_size,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--size-mb", type=float, required=True)
    parser.add_argument("--world-size", type=positive_int, required=True)
    parser.add_argument("--warmup", type=non_negative_int, default=5)
    parser.add_argument("--iterations", type=positive_int, default=20)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.size_mb <= 0:
        parser.error(f"--size-mb must be positive, got {args.size_mb}")
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    launch_or_work("cs336_systems.sections.distributed.time_allreduce", "allreduce", config, args.output, work,
                   args.world_size, args.backend, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
