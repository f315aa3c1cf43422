"""naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, ddp_overlap_* (§4.3-4.5).

    python -m cs336_systems.experiments.ddp --variant bucketed --bucket-size-mb 100 \
        --size xl --context-length 128 --batch-size 16 --world-size 2 --output r.json \
        [--trace r.trace.json.gz]

Times data-parallel training steps of the LM (AdamW, batch split over the ranks) with one of
the variants of `cs336_systems.distributed.variants.DDP_VARIANTS` (naive, flat, overlap,
bucketed, and torch's DistributedDataParallel as the reference).
Phases are timed with the harness (synchronize after each). For naive and flat the all-reduces
are their own `communicate` phase; for the overlapped variants communication runs inside the
backward phase and `communicate` is the exposed wait in finish_gradient_synchronization. A
profiler trace of `PROFILE_STEPS` steps (rank 0) goes to --trace, and from the same profile the
time per step during which a collective was running (`collective_busy_ms_per_step`, overlaps
merged); the record's `profile_steps` says how many steps were profiled.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from cs336_systems.distributed import (DDP, DDPBucketed, allreduce_gradients_flat,
                                       allreduce_gradients_individually, broadcast_parameters)
from cs336_systems.distributed.launch import BACKENDS
from cs336_systems.distributed.variants import DDP_VARIANTS
from cs336_systems.experiments.cli import add_common_arguments, non_negative_int, positive_int
from cs336_systems.experiments.torchrun import backend_for, launch_or_work
from cs336_systems.lm_step import random_batch
from cs336_systems.loss import cross_entropy
from cs336_systems.memory import peak_gib, tensor_bytes
from cs336_systems.model import MODEL_SIZES, build_model, count_parameters
from cs336_systems.optimizer import AdamW
from cs336_systems.profiling import capture, export_trace
from cs336_systems.timing import time_phases

# Steps profiled after the timed ones: the collective busy time and rank 0's trace cover them.
PROFILE_STEPS = 2


def wrap(model: torch.nn.Module, config: dict, device: torch.device) -> torch.nn.Module:
    variant = config["variant"]
    if variant == "overlap":
        return DDP(model)
    if variant == "bucketed":
        return DDPBucketed(model, config["bucket_size_mb"])
    if variant == "torch":
        device_ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    broadcast_parameters(model)
    return model


def communicate_fn(model: torch.nn.Module, variant: str):
    if variant == "naive":
        return lambda: allreduce_gradients_individually(model)
    if variant == "flat":
        return lambda: allreduce_gradients_flat(model)
    if variant in ("overlap", "bucketed"):
        return model.finish_gradient_synchronization
    return lambda: None  # torch's DDP has finished its all-reduces when backward returns


def is_collective(name: str, device: torch.device) -> bool:
    """The events that do the communication: NCCL's kernels on CUDA (not the `nccl:*`
    annotations around them, which span the same time), gloo's operations on the CPU."""
    name = name.lower()
    if device.type == "cuda":
        return name.startswith(("ncclkernel", "nccldevkernel"))
    return name.startswith("gloo:")


def merged_length(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: overlapping calls count once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def collective_busy_ms_per_step(prof, device: torch.device, steps: int) -> float:
    """Wall time per step during which at least one collective was running, from the profile."""
    intervals = [(e.time_range.start, e.time_range.end) for e in prof.events()
                 if is_collective(e.name, device)]
    return merged_length(intervals) / 1e3 / steps


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    torch.manual_seed(config["seed"])
    model = wrap(build_model(config["size"], config["context_length"], device=device), config, device)
    optimizer = AdamW(model.parameters(), lr=1e-4)
    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"], rank, world_size)
    state = {}

    def forward():
        state["loss"] = cross_entropy(model(token_ids), targets)

    def backward():
        state.pop("loss").backward()

    def optimizer_step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    phases = [("forward", forward), ("backward", backward),
              ("communicate", communicate_fn(model, config["variant"])),
              ("optimizer", optimizer_step)]
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    metrics = {k: v for k, v in times.metrics().items() if "warmup" not in k}

    with capture(device) as prof:
        time_phases(phases, device, 0, PROFILE_STEPS)
    metrics["profile_steps"] = PROFILE_STEPS
    metrics["collective_busy_ms_per_step"] = collective_busy_ms_per_step(prof, device,
                                                                         PROFILE_STEPS)
    if rank == 0 and config["trace"]:
        export_trace(prof, config["trace"])
        metrics["trace_file"] = Path(config["trace"]).name

    metrics["parameters"] = count_parameters(model)
    metrics["gradient_bytes"] = tensor_bytes(p for p in model.parameters() if p.requires_grad)
    if config["variant"] == "bucketed":
        metrics["buckets"] = len(model.buckets)
    metrics["peak_gib"] = peak_gib(device)
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", required=True, choices=list(DDP_VARIANTS))
    parser.add_argument("--bucket-size-mb", type=float, default=None,
                        help="bucket size for --variant bucketed")
    parser.add_argument("--size", default="xl", choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, default=128)
    parser.add_argument("--batch-size", type=positive_int, default=16, help="global batch size")
    parser.add_argument("--world-size", type=positive_int, default=2)
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="default: nccl for --device cuda, gloo for cpu, auto: what is here")
    parser.add_argument("--warmup-steps", type=non_negative_int, default=3)
    parser.add_argument("--measure-steps", type=positive_int, default=10)
    parser.add_argument("--trace", default=None, help="where to write rank 0's profiler trace")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.batch_size % args.world_size:
        parser.error(f"--batch-size {args.batch_size} does not split evenly over "
                     f"--world-size {args.world_size}")
    if (args.variant == "bucketed") != (args.bucket_size_mb is not None):
        parser.error("--bucket-size-mb goes with --variant bucketed, and only with it")
    if args.bucket_size_mb is not None and args.bucket_size_mb <= 0:
        parser.error(f"--bucket-size-mb must be positive, got {args.bucket_size_mb}")
    backend = args.backend or backend_for(args.device)
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    config["backend"] = backend
    launch_or_work("cs336_systems.experiments.ddp", "ddp", config, args.output, work,
                   args.world_size, backend, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
