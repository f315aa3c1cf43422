"""benchmarking_script (assignment §1.1): time one model configuration.

    python -m cs336_systems.sections.benchmark.time_step --size small --context-length 128 \
        --mode train-step --precision bf16 --warmup-steps 5 --measure-steps 10 --output r.json

With --compile the model is `torch.compile`d (torch_compile (b), assignment 3.2): the first
warm-up step then includes the compilation.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.lm.build import build_lm_step
from cs336_systems.lm.model import count_parameters, forward_flops
from cs336_systems.measure.memory import peak_gib, reset_peak
from cs336_systems.measure.timing import time_phases
from cs336_systems.pipeline.cli import add_common_arguments
from cs336_systems.pipeline.options import add_lm_step_arguments, check_context_length
from cs336_systems.pipeline.records import run_and_record


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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_lm_step_arguments(parser, warmup_steps=5, measure_steps=10)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                        help="torch.compile the whole model (torch_compile, assignment 3.2)")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    return run_and_record("benchmark", config, args.output,
                          lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
