"""One rank's all-reduce timings at one size, backend and world size (the CLI:
`time_allreduce`)."""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from cs336_systems.measure.timing import summarize, time_phases


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    size_bytes = int(config["size_mb"] * 1e6)
    torch.manual_seed(config["seed"] + rank)
    tensor = torch.randn(size_bytes // 4, device=device)
    phases = [("allreduce", lambda: dist.all_reduce(tensor)),
              ("rescale", lambda: tensor.div_(world_size))]  # keeps the values bounded
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"], total_name=None)
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
