"""The speed targets' measurements (`cs336_systems.sections.flash.targets`): one group of
targets, ours and every reference its targets name, in one process, at each of its shapes
(batch x seq x d). The job's CLI is `time_targets`.

- `versus` groups: each implementation is probed (an SDPA backend that cannot run here is
  `skipped` with SDPA's reason), compiled where its target says, run once to warm up, then
  timed with `timing.benchmark_ms` (a `do_bench` median) in `--rounds` interleaved rounds
  (ours, reference, ours, reference, ...). A value is the median of its rounds' medians, and its
  spread their standard deviation: do_bench's median carries no spread of its own. Groups of a
  graph metric (`GRAPH_METRICS`) time each step, a forward or a forward+backward, replayed from
  a CUDA graph, so that the GPU's time is measured without the host's.
- `longest`: our forward+backward once at each shape's length, halving the length after an
  out-of-memory; the value is the longest length that ran.
- `cold_compile`: a fresh Python process with empty Triton and Inductor caches
  (`flash_cold_compile`) compiles and runs the leaderboard case's forward+backward once; the
  value is the seconds from its start to its end.

An out-of-memory ends only the measurement it happened in (status `oom`). The record's metrics
hold one entry per (implementation, shape): `{"attention", "shape", "metric", "status", "value",
"std", "rounds", "message"?}`. These are GPU timings: without CUDA the job records `skipped`.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from cs336_systems.lm.attention import get_attention, unavailable_reason
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.measure.memory import peak_gib, reset_peak
from cs336_systems.measure.timing import benchmark_ms, synchronize
from cs336_systems.paths import SRC_ROOT
from cs336_systems.pipeline.records import Skip, is_out_of_memory
from cs336_systems.sections.flash.latency import attention_inputs
from cs336_systems.sections.flash.targets import (
    COLD_COMPILE_CLI,
    GRAPH_METRIC,
    GRAPH_METRICS,
    GROUPS,
    OURS,
    AttentionRun,
    Shape,
    group_runs,
    group_targets,
)

log = logging.getLogger("cs336_systems")
# A cold compilation still running after this many times its target's bound is stopped.
COLD_COMPILE_PATIENCE = 2


# --- one implementation at one shape ---------------------------------------------------------

def attend_fn(impl: AttentionRun) -> Callable:
    """The implementation's function, under torch.compile (static shapes) where `impl` says."""
    fn = get_attention(impl.name)
    return torch.compile(fn, dynamic=False) if impl.compiled else fn


def step_fn(attend: Callable, metric: str, inputs: tuple, causal: bool) -> Callable[[], None]:
    """One forward (`forward_ms`, and its CUDA graph's twin) or one forward+backward
    (`forward_backward_ms`; for a CUDA graph, `GRAPH_METRIC`, gradients returned rather than
    accumulated into .grad, whose tensors a graph could not follow)."""
    q, k, v, grad_o = inputs
    if metric in ("forward_ms", GRAPH_METRICS["forward_ms"]):
        return lambda: attend(q, k, v, causal)
    if metric == GRAPH_METRIC:
        return lambda: torch.autograd.grad(attend(q, k, v, causal), (q, k, v), grad_o)
    return lambda: attend(q, k, v, causal).backward(grad_o)


def replayed(step: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """`step` captured in a CUDA graph after three warm-up calls on a side stream (as torch's
    docs prescribe), returned as the graph's replay: the step's GPU work with none of the
    host's."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _entry(impl: AttentionRun, shape: Shape, metric: str, status: str = "ok", **fields) -> dict:
    return {"attention": impl.key, "shape": list(shape), "metric": metric, "status": status, **fields}


def _out_of_memory(impl: AttentionRun, shape: Shape, metric: str, error: BaseException,
                   device: torch.device) -> dict:
    log.info("%s at %s: out of memory", impl.key, shape)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return _entry(impl, shape, metric, "oom", message=str(error).splitlines()[0])


def _summary(rounds: list[float]) -> dict:
    return {"value": statistics.median(rounds),
            "std": statistics.stdev(rounds) if len(rounds) > 1 else None, "rounds": rounds}


# --- versus: ours and the references, interleaved --------------------------------------------

def time_versus(shape: Shape, impls: list[AttentionRun], metric: str, config: dict,
                device: torch.device) -> list[dict]:
    """Each implementation at one shape, in `rounds` interleaved rounds of `benchmark_ms`."""
    torch._dynamo.reset()  # each shape compiles afresh: no recompile limit, no dynamic shapes
    torch.manual_seed(config["seed"])
    inputs = attention_inputs(shape, PRECISIONS[config["precision"]], device)
    q, k, v, _ = inputs
    steps, done = {}, {}
    graphed = metric in GRAPH_METRICS.values()
    for impl in impls:
        if reason := unavailable_reason(impl.name, q, k, v, config["causal"]):
            done[impl] = _entry(impl, shape, metric, "skipped", message=reason)
            continue
        try:
            step = step_fn(attend_fn(impl), metric, inputs, config["causal"])
            step()  # compiles where compiled, and warms up
            if graphed:
                step = replayed(step, device)
            synchronize(device)
            steps[impl] = step
        except Exception as error:  # noqa: BLE001 - only an out-of-memory is data here
            if not is_out_of_memory(error):
                raise
            done[impl] = _out_of_memory(impl, shape, metric, error, device)
    rounds: dict[AttentionRun, list[float]] = {impl: [] for impl in steps}
    for round_index in range(config["rounds"]):
        for impl, step in list(steps.items()):
            try:
                rounds[impl].append(benchmark_ms(
                    step, device, grad_to_none=None if graphed else [q, k, v]))
            except Exception as error:  # noqa: BLE001
                if not is_out_of_memory(error):
                    raise
                done[impl] = _out_of_memory(impl, shape, metric, error, device)
                del steps[impl]
        log.info("%s round %d: %s", shape, round_index + 1,
                 ", ".join(f"{i.key} {rounds[i][-1]:.3f} ms" for i in steps))
    for impl in steps:
        done[impl] = _entry(impl, shape, metric, **_summary(rounds[impl]))
    return [done[impl] for impl in impls]


def measure_versus(config: dict, device: torch.device) -> list[dict]:
    group = GROUPS[config["group"]]
    impls = group_runs(group.name)
    return [entry for shape in config["shapes"]
            for entry in time_versus(shape, impls, group.metric, config, device)]


# --- longest: the longest sequence our forward+backward runs ---------------------------------

def _forward_backward_runs(shape: Shape, config: dict, device: torch.device):
    """Our forward+backward run once at `shape`: (the step, its inputs), or None if it ran out
    of memory (whose tensors are freed when this returns)."""
    try:
        inputs = attention_inputs(shape, PRECISIONS[config["precision"]], device)
        step = step_fn(attend_fn(AttentionRun(OURS)), "forward_backward_ms", inputs, config["causal"])
        step()
        synchronize(device)
        return step, inputs
    except Exception as error:  # noqa: BLE001
        if not is_out_of_memory(error):
            raise
        return None


def longest_run(shape: Shape, config: dict, device: torch.device) -> dict:
    """Our forward+backward at the shape's length, halved after each out-of-memory until one
    runs; the one that runs is timed too."""
    batch, seq, d = shape
    impl, metric = AttentionRun(OURS), GROUPS["longest"].metric
    tried = {}
    while seq >= 1:
        reset_peak(device)
        ran = _forward_backward_runs((batch, seq, d), config, device)
        tried[seq] = "ok" if ran else "oom"
        if ran:
            step, inputs = ran
            return _entry(impl, shape, metric, value=seq, tried=tried, peak_gib=peak_gib(device),
                          forward_backward_ms=benchmark_ms(step, device, grad_to_none=inputs[:3]))
        torch.cuda.empty_cache()
        seq //= 2
    return _entry(impl, shape, metric, "oom", tried=tried,
                  message="out of memory at every length down to 1")


def measure_longest(config: dict, device: torch.device) -> list[dict]:
    return [longest_run(tuple(shape), config, device) for shape in config["shapes"]]


# --- cold_compile: compilation from empty caches, in a fresh process -------------------------

def first_compiled_step(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                        causal: bool) -> None:
    """The child's work: one compiled forward+backward of our kernel, to its end on the device."""
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    attend = torch.compile(get_attention(OURS))
    attend(q, k, v, causal).backward(torch.randn_like(q))
    synchronize(device)


def measure_cold_compile(config: dict, device: torch.device) -> list[dict]:
    """Seconds from starting a fresh process, whose Triton and Inductor caches are empty
    folders, to the end of its first compiled forward+backward of the shape."""
    (shape,) = config["shapes"]
    impl, metric = AttentionRun(OURS, compiled=True), GROUPS["cold_compile"].metric
    (target,) = group_targets("cold_compile")
    timeout = COLD_COMPILE_PATIENCE * target.bound
    src = str(SRC_ROOT)
    command = [sys.executable, "-m", COLD_COMPILE_CLI, "--shape",
               "x".join(map(str, shape)), "--precision", config["precision"], "--device", str(device),
               "--causal" if config["causal"] else "--no-causal"]
    with tempfile.TemporaryDirectory(prefix="cold-compile-") as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": f"{cache}/triton",
               "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
               "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
        log.info("cold compile: %s (caches under %s)", " ".join(command), cache)
        start = time.perf_counter()
        try:
            child = subprocess.run(command, env=env, capture_output=True, text=True,
                                   timeout=timeout)
        except subprocess.TimeoutExpired:
            return [_entry(impl, shape, metric, "timeout",
                           message=f"no compiled forward+backward within {timeout:g} s")]
        seconds = time.perf_counter() - start
    sys.stderr.write(child.stderr)  # the child's log, into this job's log
    if child.returncode != 0:
        if is_out_of_memory(RuntimeError(child.stderr)):
            return [_entry(impl, shape, metric, "oom", message=child.stderr.splitlines()[-1])]
        raise RuntimeError(f"the cold-compile process failed ({child.returncode}):\n"
                           + "\n".join(child.stderr.splitlines()[-20:]))
    parts = json.loads(child.stdout.splitlines()[-1])  # the child's last line
    return [_entry(impl, shape, metric, value=seconds, **parts)]


MEASURES = {"versus": measure_versus, "longest": measure_longest,
            "cold_compile": measure_cold_compile}


def measure(config: dict, device: torch.device) -> dict:
    group = GROUPS[config["group"]]
    if device.type != "cuda":
        raise Skip("the speed targets are GPU timings and this job runs on the CPU (Triton's "
                   "CPU interpreter is far too slow for their shapes)")
    if not config["shapes"]:
        raise Skip(f"no shape of this preset's flash sweep is in the {group.name} group")
    return {"measurements": MEASURES[group.kind](config, device)}
