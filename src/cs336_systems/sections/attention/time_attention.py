"""pytorch_attention and torch_compile (a) (assignment 3.1, 3.2): attention alone at one shape.

    python -m cs336_systems.sections.attention.time_attention --d 64 --seq 4096 --output r.json \
        [--compile] [--memory-cap-gib 24] [--batch-size 8 --warmup 5 --iterations 100]

q, k, v of shape (batch, seq, d) in fp32, no head dimension, through the registry's `eager`
attention, or `torch.compile` of it. The harness times `iterations` forward passes (after
`warmup` untimed ones), then reads the memory in use after one more forward, before its backward,
then times `iterations` backward passes (each after an untimed forward that builds its graph),
synchronizing after each. The first forward and backward are kept apart (`first_*_ms`): with
`--compile` they include compilation. An out-of-memory is a result: status `oom`, the pass that
ran out (`oom_pass`), and what was measured before it. `--memory-cap-gib` caps this process's
share of the GPU, to show where a 24, 40 or 80 GB card runs out.
"""

from __future__ import annotations

import argparse

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
from cs336_systems.pipeline.cli import (
    add_common_arguments,
    non_negative_int,
    positive_int,
)
from cs336_systems.pipeline.records import OutOfMemoryIn, is_out_of_memory, run_and_record


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

    warmup, iterations = config["warmup"], config["iterations"]
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=positive_int, required=True, help="head dimension")
    parser.add_argument("--seq", type=positive_int, required=True, help="sequence length")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                        help="time torch.compile(eager attention)")
    parser.add_argument("--warmup", type=non_negative_int, default=5)
    parser.add_argument("--iterations", type=positive_int, default=100)
    parser.add_argument("--memory-cap-gib", type=float, default=None,
                        help="let this process use at most this much GPU memory")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    if args.compile and args.warmup < 1:
        parser.error("--compile needs --warmup of at least 1, or compilation lands in the timings")
    if args.memory_cap_gib is not None and args.memory_cap_gib <= 0:
        parser.error(f"--memory-cap-gib must be positive, got {args.memory_cap_gib}")
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    return run_and_record("attention", config, args.output,
                          lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
