"""gradient_checkpointing (b) (assignment §2): one LM step with one level of recomputation, k
blocks per checkpoint: its peak memory and its step time.

    python -m cs336_systems.sections.checkpointing.time_checkpointing --size 2.7b --context-length 2048 \
        --mode forward-backward --checkpoint-block-size 4 --output r.json

Leave out `--checkpoint-block-size` for no checkpointing. The job builds the step
(`build_lm_step`: the model's `checkpoint_block_size`, non-reentrant `torch.utils.checkpoint`),
runs the warm-up steps, then times the measured steps with the harness inside a peak window
(`memory.peak_window`: the CUDA allocator's peak, reset after the warm-up). On a CPU the peak
comes from one more step under the live-tensor stand-in (`memory.LiveBytes`), which would slow
the timed ones. The record holds the memory in use at the start
(`start_gib`: parameters, and optimizer state in train-step), the peak (`peak_gib`), where the
peak was read (`peak_source`), the parameters' gradient bytes (allocated during every backward)
and the step times. An out-of-memory is a result: the record gets status `oom` with what was
known before it.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from cs336_systems.lm.build import build_lm_step
from cs336_systems.lm.model import count_parameters
from cs336_systems.measure.memory import GIB, device_gib, peak_window
from cs336_systems.measure.timing import time_phases
from cs336_systems.pipeline.cli import add_common_arguments
from cs336_systems.pipeline.options import add_lm_step_arguments, check_context_length
from cs336_systems.pipeline.records import OutOfMemoryIn, run_and_record


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


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_lm_step_arguments(parser, warmup_steps=2, measure_steps=3)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    if args.mode == "forward":
        parser.error("--mode forward runs without gradients, so there is nothing to recompute: "
                     "checkpointing needs a backward pass (use forward-backward or train-step)")
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    return run_and_record("checkpointing", config, args.output,
                          lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
