"""One LM step of one configuration timed with the harness, with its FLOPs and peak memory (the
CLI: `time_step`)."""

from __future__ import annotations

import torch

from cs336_systems.lm.build import build_lm_step
from cs336_systems.lm.model import count_parameters, forward_flops
from cs336_systems.measure.memory import peak_gib, reset_peak
from cs336_systems.measure.timing import time_phases


def measure(config: dict, device: torch.device) -> dict:
    # with --compile, compiled on the first (warm-up) step: step_warmup_ms_samples[0]
    model, phases = build_lm_step(config, device)
    reset_peak(device)
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    flops = forward_flops(config["size"], config["batch_size"], config["context_length"]) * (
        1 if config["mode"] == "forward" else 3)
    metrics = {"parameters": count_parameters(model), "model_flops_per_step": flops,
               **times.metrics(), "peak_gib": peak_gib(device)}
    return metrics
