"""One rank's share of a DDP variant's training benchmark: step time and the time spent in
communication (the CLI: `time_ddp`)."""

from __future__ import annotations

import torch

from cs336_systems.distributed.training import communicate_fn, training_phases, wrap_ddp
from cs336_systems.lm.model import build_model, count_parameters
from cs336_systems.measure.collectives import profile_steps
from cs336_systems.measure.memory import peak_gib, tensor_bytes
from cs336_systems.measure.timing import time_phases


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    torch.manual_seed(config["seed"])
    model = wrap_ddp(build_model(config["size"], config["context_length"], device=device), config, device)
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
