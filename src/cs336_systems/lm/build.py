"""One LM step built from one configuration: the benchmark, the profiler, the memory and the
checkpointing jobs run exactly the same step.

    model, phases = build_lm_step({"size": "small", "context_length": 256, "mode": "train-step",
                                   ...}, device)
    times = time_phases(phases, device, warmup_steps, measure_steps)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from cs336_systems.lm.model import build_model
from cs336_systems.lm.optimizer import build_optimizer
from cs336_systems.lm.step import lm_step_phases, random_batch
from cs336_systems.measure.timing import Phase


def build_lm_step(config: Mapping, device: torch.device) -> tuple[nn.Module, list[Phase]]:
    """The model and the phases of one step: keys size, context_length, attention, batch_size,
    mode, precision, seed, and optionally checkpoint_block_size (see `TransformerLM`),
    optimizer (a name of `OPTIMIZERS`, for train-step; AdamW by default), compile
    (`torch.compile` the model; it compiles on the first step) and compile_mode (torch.compile's
    `mode`: "reduce-overhead" replays each compiled graph as a CUDA graph)."""
    torch.manual_seed(config["seed"])
    model = build_model(config["size"], config["context_length"],
                        attention=config["attention"],
                        checkpoint_block_size=config.get("checkpoint_block_size"), device=device)
    if config.get("compile"):
        model = torch.compile(model, mode=config.get("compile_mode"))
    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"])
    optimizer = (build_optimizer(config.get("optimizer") or "adamw", model.parameters())
                 if config["mode"] == "train-step" else None)
    return model, lm_step_phases(model, token_ids, targets, config["mode"],
                                 config["precision"], optimizer)


def cpu_unavailable_reason(attention: str, optimizer: str, compile_: bool,
                           precision: str) -> str | None:
    """Why a step with these parts cannot run on a CPU, or None if it can."""
    from cs336_systems.lm.attention import attention_label
    from cs336_systems.lm.optimizer import optimizer_label
    triton = attention.startswith("flash-triton")
    if triton and precision != "fp32":
        return "Triton's CPU interpreter cannot run bf16 tl.dot (triton-lang/triton#11584)"
    if compile_ and (triton or optimizer == "adamw-fused"):
        return "torch.compile cannot trace kernels run by Triton's CPU interpreter"
    if attention == "sdpa-cudnn":
        return f"{attention_label(attention)} needs CUDA"
    if optimizer == "torch-adamw-fused":
        return f"{optimizer_label(optimizer)} needs CUDA"
    return None
