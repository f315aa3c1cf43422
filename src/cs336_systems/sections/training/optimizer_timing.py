"""The optimizer step alone: each optimizer of `FLAT_OPTIMIZERS` timed in one process beside a
copy's memory-bandwidth floor (the CLI: `time_optimizer`)."""

from __future__ import annotations

import statistics

import torch

from cs336_systems.lm.model import build_model
from cs336_systems.lm.optimizer import build_optimizer
from cs336_systems.measure.ceilings import copy_gbps
from cs336_systems.measure.memory import GIB, allocated_gib, peak_gib, reset_peak
from cs336_systems.measure.timing import benchmark_ms
from cs336_systems.pipeline.records import Skip, is_out_of_memory

BYTES_PER_PARAMETER = 7 * 4  # fp32: read p, g, m, v; write p, m, v


def time_optimizer(name: str, params: list[torch.nn.Parameter], rounds: int,
                   device: torch.device) -> dict:
    optimizer = build_optimizer(name, params)
    try:
        optimizer.step()  # creates the state
        torch.cuda.synchronize(device)
        before = allocated_gib(device)
        reset_peak(device)
        optimizer.step()
        extra = peak_gib(device) - before
        medians = [benchmark_ms(optimizer.step, device) for _ in range(rounds)]
        return {"optimizer": name, "status": "ok", "ms_median": statistics.median(medians),
                "ms_min": min(medians), "ms_max": max(medians), "rounds_ms": medians,
                "extra_gib": extra}
    except torch.OutOfMemoryError as error:
        return {"optimizer": name, "status": "oom", "message": str(error).splitlines()[0]}
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        return {"optimizer": name, "status": "oom", "message": str(error).splitlines()[0]}
    finally:
        optimizer.state.clear()
        del optimizer
        torch.cuda.empty_cache()


def measure(config: dict, device: torch.device) -> dict:
    if device.type != "cuda":
        raise Skip("the optimizer benchmark times CUDA kernels against the GPU's bandwidth; "
                   f"this job runs on {device.type}")
    bandwidth = copy_gbps(device)
    params = list(build_model(config["size"], context_length=16, device=device).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    count = sum(p.numel() for p in params)
    floor_ms = count * BYTES_PER_PARAMETER / (bandwidth * 1e9) * 1e3
    return {"parameters": count, "copy_gbps": bandwidth, "floor_ms": floor_ms,
            "bytes_per_parameter": BYTES_PER_PARAMETER,
            "state_gib": 2 * count * 4 / GIB,
            "optimizers": [time_optimizer(name, params, config["rounds"], device)
                           for name in config["optimizers"]]}
