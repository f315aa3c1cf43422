"""optimizer_state_sharding (§4.7): memory and step time with and without ShardedOptimizer.

    python -m cs336_systems.experiments.sharded_optimizer --sharded --size xl \
        --context-length 128 --batch-size 8 --world-size 2 --output r.json

Data-parallel AdamW training of the LM (flat gradient all-reduce), with the optimizer either
replicated (`--no-sharded`, torch.optim-style AdamW on every rank) or wrapped in
ShardedOptimizer. Records, on rank 0, allocated memory after building the model and
optimizer, right before and right after the optimizer step, and the peak of the whole step;
a breakdown computed from the tensors themselves (parameters, gradients, this rank's optimizer
state); and the phase times. On a CPU the memory readings are absent (no allocator stats) and
the breakdown still holds.
"""

from __future__ import annotations

import argparse
import sys

import torch

from cs336_systems.distributed import ShardedOptimizer, allreduce_gradients_flat, broadcast_parameters
from cs336_systems.experiments.cli import add_common_arguments, non_negative_int, positive_int
from cs336_systems.experiments.torchrun import backend_for, launch_or_work
from cs336_systems.lm_step import random_batch
from cs336_systems.loss import cross_entropy
from cs336_systems.memory import GIB, allocated_gib, peak_gib, reset_peak, tensor_bytes
from cs336_systems.model import MODEL_SIZES, build_model
from cs336_systems.optimizer import AdamW
from cs336_systems.timing import time_phases


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    inner = optimizer.local_optimizer if isinstance(optimizer, ShardedOptimizer) else optimizer
    if inner is None:
        return 0
    return sum(tensor_bytes(state.values()) for state in inner.state.values())


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    allocated = lambda: allocated_gib(device)  # noqa: E731
    torch.manual_seed(config["seed"])
    model = build_model(config["size"], config["context_length"], device=device)
    broadcast_parameters(model)
    if config["sharded"]:
        optimizer = ShardedOptimizer(model.parameters(), AdamW, lr=1e-4)
    else:
        optimizer = AdamW(model.parameters(), lr=1e-4)
    metrics = {"allocated_gib_after_init": allocated()}

    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"], rank, world_size)
    readings: dict[str, float | None] = {}

    def forward_backward():
        cross_entropy(model(token_ids), targets).backward()

    def optimizer_step():
        readings["before_step"] = allocated()
        optimizer.step()
        readings["after_step"] = allocated()
        optimizer.zero_grad(set_to_none=True)

    phases = [("forward_backward", forward_backward),
              ("communicate", lambda: allreduce_gradients_flat(model)),
              ("optimizer", optimizer_step)]
    reset_peak(device)
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    metrics.update({k: v for k, v in times.metrics().items() if "warmup" not in k})
    metrics["allocated_gib_before_step"] = readings["before_step"]
    metrics["allocated_gib_after_step"] = readings["after_step"]
    metrics["peak_gib"] = peak_gib(device)

    metrics["parameter_gib"] = tensor_bytes(model.parameters()) / GIB
    metrics["gradient_gib"] = metrics["parameter_gib"]  # one fp32 gradient per parameter
    metrics["optimizer_state_gib"] = optimizer_state_bytes(optimizer) / GIB
    states = [None] * world_size
    torch.distributed.all_gather_object(states, metrics["optimizer_state_gib"])
    metrics["optimizer_state_gib_per_rank"] = states
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sharded", action=argparse.BooleanOptionalAction, required=True)
    parser.add_argument("--size", default="xl", choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, default=128)
    parser.add_argument("--batch-size", type=positive_int, default=8, help="global batch size")
    parser.add_argument("--world-size", type=positive_int, default=2)
    parser.add_argument("--warmup-steps", type=non_negative_int, default=2)
    parser.add_argument("--measure-steps", type=positive_int, default=5)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.batch_size % args.world_size:
        parser.error(f"--batch-size {args.batch_size} does not split evenly over "
                     f"--world-size {args.world_size}")
    backend = backend_for(args.device)
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    config["backend"] = backend
    launch_or_work("cs336_systems.experiments.sharded_optimizer", "sharded_optimizer", config,
                   args.output, work, args.world_size, backend,
                   sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
