"""One LM step with one level of recomputation (k blocks per checkpoint): its peak memory and
step time (the CLI: `time_checkpointing`)."""

from __future__ import annotations

import math

import torch

from cs336_systems.lm.build import build_lm_step
from cs336_systems.lm.model import count_parameters
from cs336_systems.measure.memory import GIB, device_gib, peak_window
from cs336_systems.measure.timing import time_phases
from cs336_systems.pipeline.records import OutOfMemoryIn


def measure(config: dict, device: torch.device) -> dict:
    model, phases = build_lm_step(config, device)
    parameters = count_parameters(model)
    layers = len(model.layers)
    k = config["checkpoint_block_size"]
    metrics = {"parameters": parameters, "num_layers": layers,
               "checkpoints": math.ceil(layers / k) if k else 0,
               # fp32 gradients, one per parameter, made by each backward
               "parameter_gradient_gib": parameters * 4 / GIB, "device_gib": device_gib(device)}
    try:
        if config["warmup_steps"]:
            warmup = time_phases(phases, device, 0, config["warmup_steps"])
            metrics["warmup_step_ms_samples"] = warmup.measured_ms["step"]
    except torch.OutOfMemoryError as error:
        raise OutOfMemoryIn("warm-up", metrics, error) from error
    existing = [*model.parameters(), *model.buffers()]
    try:
        if device.type == "cuda":  # the allocator costs nothing: the timed steps give the peak
            with peak_window(device) as reading:
                metrics["start_gib"] = reading.start_bytes / GIB
                times = time_phases(phases, device, 0, config["measure_steps"])
        else:  # the stand-in slows every op: time without it, then one more step under it
            times = time_phases(phases, device, 0, config["measure_steps"])
            with peak_window(device, existing) as reading:
                metrics["start_gib"] = reading.start_bytes / GIB
                time_phases(phases, device, 0, 1)
    except torch.OutOfMemoryError as error:
        raise OutOfMemoryIn("measured", metrics, error) from error
    return {**metrics, **times.metrics(), "peak_gib": reading.peak_gib,
            "above_start_gib": reading.peak_gib - reading.start_gib,
            "peak_source": reading.source}
