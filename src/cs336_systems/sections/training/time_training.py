"""One training step of the section's table (`runs.RUNS`): forward, loss, backward and the
optimizer's step, timed, with the job's own bf16 matmul ceiling.

    python -m cs336_systems.sections.training.time_training --run ours-fa2-fused-compiled \
        --size 2.7b --context-length 512 --batch-size 4 --output r.json

Times `--measure-steps` steps after `--warmup-steps` (compilation happens in the warm-up) with
the timing harness, each phase on its own (`step_ms_*`, `optimizer_ms_*`, ...), then three
times `--measure-steps` whole steps back to back, as a training loop runs them
(`loop_step_ms_*`: the step time the report compares), all under autocast to `--precision`
(fp32 weights and optimizer state; a run with `master_weights` holds its matmul weights as
bf16 copies of fp32 masters kept by the fused optimizer). The
record has each phase's times, the peak memory, the model FLOPs of a step (3x the forward's
matmuls) and the rate of a large bf16 matrix product measured in the same process, against
which the report puts the step's rate. A run this machine cannot take (Hugging Face's
transformers missing, SDPA's cuDNN backend unavailable, a Triton kernel in bf16 on a CPU)
records `skipped` with the reason.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.lm.build import build_lm_step, cpu_unavailable_reason
from cs336_systems.lm.hf_llama import build_hf_llama, unavailable_reason
from cs336_systems.lm.model import MODEL_SIZES, forward_flops
from cs336_systems.lm.optimizer import build_optimizer
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.step import lm_step_phases, random_batch
from cs336_systems.measure.ceilings import matmul_tflops
from cs336_systems.measure.memory import peak_gib, reset_peak
from cs336_systems.measure.timing import summarize, time_back_to_back, time_phases
from cs336_systems.pipeline.cli import (
    add_common_arguments,
    non_negative_int,
    positive_int,
)
from cs336_systems.pipeline.options import check_context_length
from cs336_systems.pipeline.records import Skip, run_and_record
from cs336_systems.sections.training.runs import RUNS, TrainingRun

MODE = "train-step"


def skip_reason(run: TrainingRun, config: dict, device: torch.device) -> str | None:
    if run.model == "hf-llama":
        return unavailable_reason()
    if device.type == "cpu":
        if run.graphs:
            return "CUDA graphs need CUDA"
        return cpu_unavailable_reason(run.attention, run.optimizer, run.compile,
                                      config["precision"])
    return None


def compile_mode(run: TrainingRun) -> str | None:
    return "reduce-overhead" if run.graphs else None


def build_step(run: TrainingRun, config: dict, device: torch.device):
    """The model and the phases of one training step of `run`."""
    if run.model == "ours":
        return build_lm_step({**config, "attention": run.attention, "optimizer": run.optimizer,
                              "compile": run.compile, "compile_mode": compile_mode(run),
                              "master_weights": run.master_weights, "mode": MODE}, device)
    torch.manual_seed(config["seed"])
    model = build_hf_llama(config["size"], config["context_length"], device)
    optimizer = build_optimizer(run.optimizer, model.parameters())
    if run.compile:
        model = torch.compile(model, mode=compile_mode(run))
    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"])
    return model, lm_step_phases(model, token_ids, targets, MODE, config["precision"], optimizer)


def measure(config: dict, device: torch.device) -> dict:
    run = RUNS[config["run"]]
    if reason := skip_reason(run, config, device):
        raise Skip(reason)
    ceiling = matmul_tflops(device) if device.type == "cuda" else None
    reset_peak(device)
    model, phases = build_step(run, config, device)
    times = time_phases(phases, device, config["warmup_steps"], config["measure_steps"])
    metrics = {k: v for k, v in times.metrics().items() if "warmup" not in k}
    loop = time_back_to_back(phases, device, config["measure_steps"])
    metrics.update({f"loop_step_ms_{k}": v for k, v in summarize(loop).items()},
                   loop_step_ms_samples=loop)
    metrics.update(
        peak_gib=peak_gib(device), matmul_tflops=ceiling,
        model_flops=3 * forward_flops(config["size"], config["batch_size"],
                                      config["context_length"]),
        parameters=sum(p.numel() for p in model.parameters()))
    return metrics


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, choices=list(RUNS))
    parser.add_argument("--size", required=True, choices=list(MODEL_SIZES))
    parser.add_argument("--context-length", type=positive_int, required=True)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--precision", default="bf16", choices=list(PRECISIONS))
    parser.add_argument("--warmup-steps", type=non_negative_int, default=3)
    parser.add_argument("--measure-steps", type=positive_int, default=5)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    check_context_length(parser, args)
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    return run_and_record("training", config, args.output,
                          lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
