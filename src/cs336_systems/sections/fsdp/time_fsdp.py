"""fsdp and fsdp_accounting (§6.2, 2026): this project's FSDP beside torch's FSDP2 and DDP.

    python -m cs336_systems.sections.fsdp.time_fsdp --variant fsdp --size 2.7b --context-length 512 \
        --batch-size 8 --world-size 2 --output r.json [--trace r.trace.json.gz]

Times training steps of the LM (this project's AdamW, the batch split over the ranks) wrapped
in one of `FSDP_VARIANTS`: `fsdp` (cs336_systems.distributed.FSDP), `fsdp2` (torch's
`fully_shard` on each block and on the root: the reference) and `bucketed` (DDPBucketed, every
rank holding everything). Phases as in the DDP benchmark (`communicate` is the exposed wait in
finish_gradient_synchronization). The record has each rank's peak memory, the sharding
breakdown of the model (what FSDP shards and what it keeps whole, in bytes: fsdp_accounting
(a)), and for `fsdp` on CUDA, from a profiler trace of the last steps, each forward use's
all-gather against the moment its layer could have started (fsdp_accounting (b),
`gather_timing`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from cs336_systems.distributed.fsdp import sharding_breakdown
from cs336_systems.distributed.training import training_phases, wrap_fsdp
from cs336_systems.distributed.variants import FSDP_VARIANTS
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
from cs336_systems.pipeline.options import add_training_arguments, training_config
from cs336_systems.pipeline.torchrun import launch_or_work


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", required=True, choices=list(FSDP_VARIANTS))
    parser.add_argument("--compute-dtype", choices=[p for p in PRECISIONS if p != "fp32"],
                        default=None, help="gather and compute in this dtype (default: fp32)")
    add_training_arguments(parser, size="2.7b", context_length=512, batch_size=8,
                           warmup_steps=2, measure_steps=5)
    config, output, _ = training_config(parser, argv)
    launch_or_work("cs336_systems.sections.fsdp.time_fsdp", "fsdp", config, output, work,
                   config["world_size"], config["backend"],
                   sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
