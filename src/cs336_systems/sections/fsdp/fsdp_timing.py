"""One rank's share of an FSDP or DDP training benchmark: step time, communication and peak
memory (the CLI: `time_fsdp`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from cs336_systems.distributed.fsdp import sharding_breakdown
from cs336_systems.distributed.training import training_phases, wrap_fsdp
from cs336_systems.lm.model import build_model
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.measure.collectives import (
    PROFILE_STEPS,
    gather_timing,
    profile_steps,
    summarize_gathers,
)
from cs336_systems.measure.memory import peak_gib, reset_peak
from cs336_systems.measure.profiling import load_trace
from cs336_systems.measure.timing import time_phases


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    torch.manual_seed(config["seed"])
    model = build_model(config["size"], config["context_length"], device=device)
    breakdown = sharding_breakdown(model)
    model = wrap_fsdp(model, config, device)
    autocast = (torch.autocast(device.type, dtype=PRECISIONS[config["compute_dtype"]])
                if config["variant"] == "bucketed" and config["compute_dtype"] else None)
    finish = getattr(model, "finish_gradient_synchronization", lambda: None)
    phases = training_phases(model, config, rank, world_size, device, finish, autocast)
    reset_peak(device)
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    metrics = {k: v for k, v in times.metrics().items() if "warmup" not in k}
    peak = peak_gib(device)
    peaks = [None] * world_size
    dist.all_gather_object(peaks, peak)
    metrics.update({"peak_gib": peak, "peak_gib_per_rank": peaks, **breakdown})

    with tempfile.TemporaryDirectory() as tmp:  # rank 0 reads its trace back
        trace = config["trace"] or str(Path(tmp) / "rank0.trace.json.gz")
        metrics.update(profile_steps(phases, device, trace, rank))
        if not config["trace"]:
            metrics.pop("trace_file", None)
        if rank == 0 and config["variant"] == "fsdp":
            rows = gather_timing(load_trace(trace), model.sharded_weights())
            metrics.update(summarize_gathers(rows, PROFILE_STEPS))
    return metrics
