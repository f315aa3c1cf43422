"""Memory and step time of one rank with and without `ShardedOptimizer` (the CLI:
`time_sharded_optimizer`)."""

from __future__ import annotations

import torch

from cs336_systems.distributed import (
    ShardedOptimizer,
    allreduce_gradients_flat,
    broadcast_parameters,
)
from cs336_systems.lm.loss import cross_entropy
from cs336_systems.lm.model import build_model
from cs336_systems.lm.optimizer import optimizer_class
from cs336_systems.lm.step import random_batch
from cs336_systems.measure.memory import (
    GIB,
    allocated_gib,
    peak_gib,
    reset_peak,
    tensor_bytes,
)
from cs336_systems.measure.timing import time_phases


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    inner = optimizer.local_optimizer if isinstance(optimizer, ShardedOptimizer) else optimizer
    if inner is None:
        return 0
    return sum(tensor_bytes(state.values()) for state in inner.state.values())


WINDOWS = ("init", "before_step", "step")


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    reset_peak(device)
    torch.manual_seed(config["seed"])
    model = build_model(config["size"], config["context_length"], device=device)
    broadcast_parameters(model)
    optimizer_cls = optimizer_class(config["optimizer"])
    if config["sharded"]:
        optimizer = ShardedOptimizer(model.parameters(), optimizer_cls, lr=1e-4)
    else:
        optimizer = optimizer_cls(model.parameters(), lr=1e-4)
    # per window: its peak and the allocation at its end, one reading per step
    memory = {"peak_gib_init": [peak_gib(device)],
              "allocated_gib_after_init": [allocated_gib(device)],
              "peak_gib_before_step": [], "allocated_gib_before_step": [],
              "peak_gib_step": [], "allocated_gib_after_step": []}

    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"], rank, world_size)

    def forward_backward():
        reset_peak(device)
        cross_entropy(model(token_ids), targets).backward()

    def optimizer_step():
        memory["peak_gib_before_step"].append(peak_gib(device))
        memory["allocated_gib_before_step"].append(allocated_gib(device))
        reset_peak(device)
        optimizer.step()
        memory["peak_gib_step"].append(peak_gib(device))
        memory["allocated_gib_after_step"].append(allocated_gib(device))
        optimizer.zero_grad(set_to_none=True)

    phases = [("forward_backward", forward_backward),
              ("communicate", lambda: allreduce_gradients_flat(model)),
              ("optimizer", optimizer_step)]
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    metrics = {k: v for k, v in times.metrics().items() if "warmup" not in k}

    measured = config["measure_steps"]
    readings = {}
    for key, values in memory.items():
        values = values if key.endswith("init") else values[-measured:]
        # peaks: the largest of the measured steps; allocations: the last step's
        readings[key] = (None if values[-1] is None
                         else max(values) if key.startswith("peak") else values[-1])
    readings["optimizer_state_gib"] = optimizer_state_bytes(optimizer) / GIB
    per_rank = [None] * world_size
    torch.distributed.all_gather_object(per_rank, readings)
    metrics.update(readings)
    metrics["memory_per_rank"] = per_rank
    peaks = [readings[f"peak_gib_{window}"] for window in WINDOWS]
    metrics["peak_gib"] = None if None in peaks else max(peaks)  # of the whole run
    metrics["parameter_gib"] = tensor_bytes(model.parameters()) / GIB
    metrics["gradient_gib"] = metrics["parameter_gib"]  # one fp32 gradient per parameter
    metrics["optimizer_state_gib_per_rank"] = [r["optimizer_state_gib"] for r in per_rank]
    return metrics
