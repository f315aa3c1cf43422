"""One training step of a run of `runs.RUNS`, each phase timed and then whole steps back to back,
beside the job's own bf16 matmul ceiling (the CLI: `time_training`)."""

from __future__ import annotations

import torch

from cs336_systems.lm.attention import package_unavailable_reason
from cs336_systems.lm.build import build_lm_step, cpu_unavailable_reason
from cs336_systems.lm.hf_llama import build_hf_llama, unavailable_reason
from cs336_systems.lm.model import forward_flops
from cs336_systems.lm.optimizer import build_optimizer
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.sizes import get_size
from cs336_systems.lm.step import lm_step_phases, random_batch
from cs336_systems.measure.ceilings import matmul_tflops
from cs336_systems.measure.memory import peak_gib, reset_peak
from cs336_systems.measure.timing import summarize, time_back_to_back, time_phases
from cs336_systems.pipeline.records import Skip
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
    spec = get_size(config["size"])  # an optional package's attention, on a GPU it supports
    return package_unavailable_reason(run.attention, spec.d_model // spec.num_heads,
                                      PRECISIONS[config["precision"]], device)


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
