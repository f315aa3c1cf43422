"""naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, ddp_overlap_* (§4.3-4.5).

    python -m cs336_systems.experiments.ddp --variant bucketed --bucket-size-mb 100 \
        --size xl --context-length 128 --batch-size 16 --world-size 2 --output r.json \
        [--trace r.trace.json.gz]

Times data-parallel training steps of the LM (AdamW, batch split over the ranks) with one of
the variants of `cs336_systems.distributed.variants.DDP_VARIANTS` (naive, flat, overlap,
bucketed, and torch's DistributedDataParallel as the reference).
Phases are timed with the harness (synchronize after each). For naive and flat the all-reduces
are their own `communicate` phase; for the overlapped variants communication runs inside the
backward phase and `communicate` is the exposed wait in finish_gradient_synchronization.

After the timed steps, `PROFILE_STEPS` more run under the profiler, each phase inside a
`record_function` range of its name. Rank 0 reads its own trace back (written to --trace, else
to a temporary file) and records, per step: the time during which a collective kernel ran
(`collective_busy_ms_per_step`, overlapping calls counted once), the time any other device work
ran (`compute_busy_ms_per_step`), the time both ran at once (`collective_hidden_ms_per_step`) and
that as a fraction of the collective time (`collective_hidden_fraction`); and `timeline`, the
last profiled step as merged intervals of compute and of collectives, in ms from the step's
first device work, with each phase's device span. The numbers are computed here, where the
trace is, so that the report needs only the record (traces stay out of git). A profile without
any collective is an error, not a missing number: it means `is_collective` no longer knows the
kernels' names.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from contextlib import nullcontext
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
from cs336_systems.intervals import intersection, length, union
from cs336_systems.profiling import capture, device_work, export_trace, load_trace
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


# NCCL's kernels by the names its versions give them: ncclKernel_* (up to 2.18),
# ncclDevKernel_* (2.19 on: ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclDevKernel_Broadcast_...),
# ncclSymkDevKernel_* (2.27 on, symmetric-memory kernels). The name says little about the
# operation (one kernel may run several); that it is NCCL's is all this needs.
NCCL_KERNEL = re.compile(r"^nccl\w*kernel", re.IGNORECASE)
# Merging compute intervals closer than this (ms) keeps a step's timeline a few hundred
# intervals long; at 400 ms per step it is far below what a figure resolves.
TIMELINE_GAP_MS = 0.1


def is_collective(name: str) -> bool:
    """The events that do the communication: NCCL's kernels on GPUs (not the `nccl:all_reduce`
    annotations around their launch, which are not device time), gloo's operations on CPUs."""
    return bool(NCCL_KERNEL.match(name)) or name.startswith("gloo:")


def _annotated(name: str, fn):
    def run():
        with torch.profiler.record_function(name):
            fn()
    return run


def _ms(intervals, origin: float) -> list[list[float]]:
    return [[round((s - origin) / 1e3, 3), round((e - origin) / 1e3, 3)] for s, e in intervals]


def overlap_metrics(events: list[dict], steps: int, phases: list[str]) -> dict:
    """From a trace of `steps` steps whose phases ran inside ranges named `phases`: the
    collective, compute and overlapping time per step, and the last step's timeline."""
    _, work = device_work(events)
    collective = [(e["ts"], e["ts"] + e["dur"], e["ts"]) for e in events
                  if e.get("ph") == "X" and is_collective(e["name"])]
    if not collective:
        names = sorted({w["name"] for w in work})[:8]
        raise RuntimeError(f"the profile of {steps} steps has no collective: is_collective "
                           f"matches none of its events (device work such as {names})")
    compute = [(w["ts"], w["ts"] + w["us"], w["launched_at"] or w["ts"]) for w in work
               if not is_collective(w["name"])]
    c_spans, k_spans = [i[:2] for i in collective], [i[:2] for i in compute]
    busy, hidden = length(c_spans), length(intersection(c_spans, k_spans))
    metrics = {"collective_busy_ms_per_step": busy / 1e3 / steps,
               "compute_busy_ms_per_step": length(k_spans) / 1e3 / steps,
               "collective_hidden_ms_per_step": hidden / 1e3 / steps,
               "collective_hidden_fraction": hidden / busy if busy > 0 else None}

    # The last step: what was launched (or, for gloo's annotations, began) after its first
    # phase began on the host.
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"] in phases]
    begun = max((e["ts"] for e in ranges if e["name"] == phases[0]), default=None)
    if begun is None:
        return metrics
    last_c = [i[:2] for i in collective if i[2] >= begun]
    last_k = [i[:2] for i in compute if i[2] >= begun]
    origin = min(s for s, _ in last_c + last_k)
    spans = {}
    for e in ranges:
        if e["ts"] >= begun:
            inside = [i[:2] for i in collective + compute
                      if e["ts"] <= i[2] < e["ts"] + e["dur"]]
            if inside:
                spans[e["name"]] = _ms([(min(s for s, _ in inside), max(t for _, t in inside))],
                                       origin)[0]
    gap = TIMELINE_GAP_MS * 1e3
    metrics["timeline"] = {
        "step_ms": round((max(t for _, t in last_c + last_k) - origin) / 1e3, 3),
        "compute": _ms(union(last_k, gap), origin),
        "collective": _ms(union(last_c, gap), origin),
        "phases": spans}
    return metrics


def profile_steps(phases, device: torch.device, trace: str | None, rank: int) -> dict:
    """PROFILE_STEPS steps under the profiler; rank 0's trace (at `trace`, if given) read back
    into `overlap_metrics` (every rank runs the steps, only rank 0 reads)."""
    names = [name for name, _ in phases]
    with capture(device) as prof:
        time_phases([(name, _annotated(name, fn)) for name, fn in phases], device, 0,
                    PROFILE_STEPS)
    metrics = {"profile_steps": PROFILE_STEPS}
    if rank != 0:
        return metrics
    with tempfile.TemporaryDirectory() as tmp:
        path = export_trace(prof, trace or Path(tmp) / "rank0.trace.json.gz")
        metrics.update(overlap_metrics(load_trace(path), PROFILE_STEPS, names))
    if trace:
        metrics["trace_file"] = Path(trace).name
    return metrics


def training_phases(model: torch.nn.Module, config: dict, rank: int, world_size: int,
                    device: torch.device, communicate, autocast=None) -> list:
    """The phases of one data-parallel training step of `model` (AdamW; this rank's rows of
    the batch): forward (under `autocast` if given) with the loss, backward, `communicate`, and
    the optimizer's step."""
    optimizer = AdamW(model.parameters(), lr=1e-4)
    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"], rank, world_size)
    state = {}

    def forward():
        with autocast or nullcontext():
            state["loss"] = cross_entropy(model(token_ids), targets)

    def backward():
        state.pop("loss").backward()

    def optimizer_step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return [("forward", forward), ("backward", backward), ("communicate", communicate),
            ("optimizer", optimizer_step)]


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    torch.manual_seed(config["seed"])
    model = wrap(build_model(config["size"], config["context_length"], device=device), config, device)
    phases = training_phases(model, config, rank, world_size, device,
                             communicate_fn(model, config["variant"]))
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    metrics = {k: v for k, v in times.metrics().items() if "warmup" not in k}

    metrics.update(profile_steps(phases, device, config["trace"], rank))

    metrics["parameters"] = count_parameters(model)
    metrics["gradient_bytes"] = tensor_bytes(p for p in model.parameters() if p.requires_grad)
    if config["variant"] == "bucketed":
        metrics["buckets"] = len(model.buckets)
    metrics["peak_gib"] = peak_gib(device)
    return metrics


def add_training_arguments(parser: argparse.ArgumentParser, *, size: str, context_length: int,
                           batch_size: int, warmup_steps: int, measure_steps: int) -> None:
    """The arguments of a data-parallel training benchmark (this one's and FSDP's), with its
    defaults; `--variant` is each benchmark's own."""
    parser.add_argument("--bucket-size-mb", type=float, default=None,
                        help="bucket size for --variant bucketed")
    parser.add_argument("--size", default=size, choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, default=context_length)
    parser.add_argument("--batch-size", type=positive_int, default=batch_size,
                        help="global batch size")
    parser.add_argument("--world-size", type=positive_int, default=2)
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="default: nccl for --device cuda, gloo for cpu, auto: what is here")
    parser.add_argument("--warmup-steps", type=non_negative_int, default=warmup_steps)
    parser.add_argument("--measure-steps", type=positive_int, default=measure_steps)
    parser.add_argument("--trace", default=None, help="where to write rank 0's profiler trace")
    add_common_arguments(parser)


def training_config(parser: argparse.ArgumentParser, argv: list[str] | None
                    ) -> tuple[dict, str, str]:
    """Parse and check `add_training_arguments`' options: (config, output, device)."""
    args = parser.parse_args(argv)
    if args.batch_size % args.world_size:
        parser.error(f"--batch-size {args.batch_size} does not split evenly over "
                     f"--world-size {args.world_size}")
    if (args.variant == "bucketed") != (args.bucket_size_mb is not None):
        parser.error("--bucket-size-mb goes with --variant bucketed, and only with it")
    if args.bucket_size_mb is not None and args.bucket_size_mb <= 0:
        parser.error(f"--bucket-size-mb must be positive, got {args.bucket_size_mb}")
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    config["backend"] = args.backend or backend_for(args.device)
    return config, args.output, args.device


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", required=True, choices=list(DDP_VARIANTS))
    add_training_arguments(parser, size="xl", context_length=128, batch_size=16,
                           warmup_steps=3, measure_steps=10)
    config, output, _ = training_config(parser, argv)
    launch_or_work("cs336_systems.experiments.ddp", "ddp", config, output, work,
                   config["world_size"], config["backend"],
                   sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
