"""The one timing harness: warm-up, synchronize, per-phase wall-clock times, statistics.

A "step" is a list of named phases (forward, backward, optimizer). Each phase is timed with
`timeit.default_timer`, and on CUDA the device is synchronized after the phase so that the
host clock sees the kernels finish, not just their launch.
"""

from __future__ import annotations

import logging
import statistics
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from cs336_systems.measure import job_clock

Phase = tuple[str, Callable[[], object]]

log = logging.getLogger("cs336_systems")


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class StepTimes:
    """Per-phase times in milliseconds, one entry per step."""

    warmup_ms: dict[str, list[float]] = field(default_factory=dict)
    measured_ms: dict[str, list[float]] = field(default_factory=dict)

    def metrics(self) -> dict[str, float | list[float]]:
        """Flat metrics: `<phase>_ms_{mean,std,min,max,median,first}` and the raw samples."""
        out: dict[str, float | list[float]] = {}
        for phase, samples in self.measured_ms.items():
            out.update({f"{phase}_ms_{k}": v for k, v in summarize(samples).items()})
            out[f"{phase}_ms_first"] = samples[0]  # shows what warm-up would have absorbed
            out[f"{phase}_ms_samples"] = samples
        for phase, samples in self.warmup_ms.items():
            out[f"{phase}_warmup_ms_samples"] = samples
        return out


def summarize(samples_ms: Sequence[float]) -> dict[str, float]:
    if not samples_ms:
        raise ValueError("no samples to summarize")
    return {
        "mean": statistics.fmean(samples_ms),
        "std": statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0,
        "min": min(samples_ms),
        "max": max(samples_ms),
        "median": statistics.median(samples_ms),
    }


def time_phases(phases: Sequence[Phase], device: torch.device | str, warmup_steps: int,
                measure_steps: int, total_name: str | None = "step",
                after_step: Callable[[], object] | None = None) -> StepTimes:
    """Run the phases in order `warmup_steps + measure_steps` times, timing each one.

    With `total_name`, each step's phase times are also summed under that name. `after_step`
    runs after every step, outside the timings (a profiler's `step()`, which advances its
    schedule).
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if measure_steps < 1:
        raise ValueError(f"measure_steps must be >= 1, got {measure_steps}")
    times = StepTimes()
    for step in range(warmup_steps + measure_steps):
        if step == warmup_steps:
            job_clock.mark("warmed")  # the job's warm-up (compilation included) ends here
        bucket = times.warmup_ms if step < warmup_steps else times.measured_ms
        total = 0.0
        for name, fn in phases:
            synchronize(device)
            start = timeit.default_timer()
            fn()
            synchronize(device)
            elapsed_ms = (timeit.default_timer() - start) * 1e3
            bucket.setdefault(name, []).append(elapsed_ms)
            total += elapsed_ms
        if total_name:
            bucket.setdefault(total_name, []).append(total)
        if after_step is not None:
            after_step()
        log.info("step %d/%d (%s): %s", step + 1, warmup_steps + measure_steps,
                 "warm-up" if step < warmup_steps else "measured",
                 ", ".join(f"{name} {bucket[name][-1]:.2f} ms" for name, _ in phases))
    return times


def time_back_to_back(phases: Sequence[Phase], device: torch.device | str, steps: int,
                      repeats: int = 3) -> list[float]:
    """Milliseconds per step of `steps` whole steps run back to back, synchronising only
    before and after them, once per repeat: what a training loop costs, the host's work
    overlapping the device's (`time_phases` synchronises after every phase to time each)."""
    per_step = []
    for _ in range(repeats):
        synchronize(device)
        start = timeit.default_timer()
        for _ in range(steps):
            for _, fn in phases:
                fn()
        synchronize(device)
        per_step.append((timeit.default_timer() - start) * 1e3 / steps)
    return per_step


def time_callable(fn: Callable[[], object], device: torch.device | str, warmup_steps: int,
                  measure_steps: int, name: str = "call") -> StepTimes:
    return time_phases([(name, fn)], device, warmup_steps, measure_steps, total_name=None)


def benchmark_ms(fn: Callable[[], object], device: torch.device | str, warmup_ms: float = 25,
                 rep_ms: float = 100, grad_to_none: Sequence[torch.Tensor] | None = None
                 ) -> float:
    """Median time of `fn` in milliseconds.

    On CUDA: `triton.testing.do_bench` (CUDA events, L2 flushed between calls, `warmup_ms` and
    `rep_ms` of running). On CPU (smoke runs): the wall-clock harness above, a few calls.
    """
    if torch.device(device).type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none,
                              return_mode="median"))

    def call():
        if grad_to_none:
            for t in grad_to_none:
                t.grad = None
        fn()
    times = time_callable(call, device, warmup_steps=1, measure_steps=3)
    return statistics.median(times.measured_ms["call"])
