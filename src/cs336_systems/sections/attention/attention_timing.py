"""Attention alone at one shape: forward and backward times and the memory saved between them,
eager or compiled (the CLI: `time_attention`)."""

from __future__ import annotations

import torch

from cs336_systems.lm.attention import get_attention
from cs336_systems.measure.memory import (
    allocated_gib,
    cap,
    device_gib,
    peak_gib,
    reset_peak,
)
from cs336_systems.measure.timing import time_phases
from cs336_systems.pipeline.records import OutOfMemoryIn, is_out_of_memory


def _first(samples: dict, phase: str) -> float:
    """The first call of `phase`, warm-up included."""
    return (samples.warmup_ms.get(phase) or samples.measured_ms[phase])[0]


def measure(config: dict, device: torch.device) -> dict:
    metrics: dict = {"device_memory_gib": device_gib(device)}
    if config["memory_cap_gib"] is not None:
        metrics["memory_fraction"] = cap(device, config["memory_cap_gib"])
    torch.manual_seed(config["seed"])
    shape = (config["batch_size"], config["seq"], config["d"])
    q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(shape, device=device)
    attend = get_attention("eager")
    if config["compile"]:
        attend = torch.compile(attend)
    state: dict = {}

    def forward():
        state.pop("out", None)  # free the last call's graph first: one graph alive at a time
        state["out"] = attend(q, k, v, config["causal"])

    def backward():
        state.pop("out").backward(grad_out)
        q.grad = k.grad = v.grad = None

    def guarded(name, fn):  # an out-of-memory names its pass and keeps what came before
        def run():
            try:
                fn()
            except Exception as error:  # also Dynamo's wrapper around an OOM while compiling
                if not is_out_of_memory(error) or isinstance(error, OutOfMemoryIn):
                    raise
                state.clear()
                raise OutOfMemoryIn(name, metrics, error) from error
        return name, run

    warmup, iterations = config["warmup_steps"], config["measure_steps"]
    reset_peak(device)
    forwards = time_phases([guarded("forward", forward)], device, warmup, iterations,
                           total_name=None)
    metrics.update({k: v for k, v in forwards.metrics().items() if "warmup" not in k})
    metrics["first_forward_ms"] = _first(forwards, "forward")
    state.clear()

    guarded("forward", forward)[1]()
    metrics["memory_before_backward_gib"] = allocated_gib(device)
    state.clear()

    backwards = time_phases([guarded("forward", forward), guarded("backward", backward)],
                            device, warmup, iterations, total_name=None)
    metrics.update({k: v for k, v in backwards.metrics().items()
                    if k.startswith("backward_") and "warmup" not in k})
    metrics["first_backward_ms"] = _first(backwards, "backward")
    metrics["peak_gib"] = peak_gib(device)
    return metrics
