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

from cs336_systems.lm.model import Linear, build_model
from cs336_systems.lm.optimizer import build_optimizer
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.step import lm_step_phases, random_batch
from cs336_systems.measure.timing import Phase


def build_lm_step(config: Mapping, device: torch.device) -> tuple[nn.Module, list[Phase]]:
    """The model and the phases of one step: keys size, context_length, attention, batch_size,
    mode, precision, seed, and optionally checkpoint_block_size (see `TransformerLM`),
    optimizer (a name of `OPTIMIZERS`, for train-step; AdamW by default), compile
    (`torch.compile` the model; it compiles on the first step), compile_mode (torch.compile's
    `mode`: "reduce-overhead" replays each compiled graph as a CUDA graph) and master_weights
    (`hold_master_weights`)."""
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
    if config.get("master_weights"):
        hold_master_weights(optimizer, model, config["precision"])
    return model, lm_step_phases(model, token_ids, targets, config["mode"],
                                 config["precision"], optimizer)


def matmul_weights(model: nn.Module) -> list[nn.Parameter]:
    """The weights that autocast casts for its matmuls: every `Linear`'s. The embedding's and
    the norms' stay fp32 under autocast, and so here."""
    return [m.weight for m in model.modules() if isinstance(m, Linear)]


def hold_master_weights(optimizer: torch.optim.Optimizer | None, model: nn.Module,
                        precision: str) -> None:
    """Hold the model's matmul weights as copies in autocast's dtype, their fp32 masters in the
    fused AdamW (`FusedAdamW.hold_masters`): the same training step without casting every
    weight down in each forward and every gradient up in each backward."""
    if optimizer is None or not hasattr(optimizer, "hold_masters"):
        raise ValueError("master_weights needs the fused AdamW (optimizer 'adamw-fused') in a "
                         f"train-step; got {type(optimizer).__name__}")
    if precision not in PRECISIONS or PRECISIONS[precision] == torch.float32:
        raise ValueError("master_weights holds copies in autocast's dtype: it needs precision "
                         f"bf16 or fp16; got {precision!r}")
    optimizer.hold_masters(matmul_weights(model), PRECISIONS[precision])


def cpu_unavailable_reason(attention: str, optimizer: str, compile_: bool,
                           precision: str) -> str | None:
    """Why a step with these parts cannot run on a CPU, or None if it can."""
    from cs336_systems.lm.attention import attention_label
    from cs336_systems.lm.optimizer import optimizer_label, runs_triton
    triton = attention.startswith("flash-triton")
    if triton and precision != "fp32":
        return "Triton's CPU interpreter cannot run bf16 tl.dot (triton-lang/triton#11584)"
    if compile_ and (triton or runs_triton(optimizer)):
        return "torch.compile cannot trace kernels run by Triton's CPU interpreter"
    if attention in ("sdpa-cudnn", "fa4"):
        return f"{attention_label(attention)} needs CUDA"
    if optimizer == "torch-adamw-fused":
        return f"{optimizer_label(optimizer)} needs CUDA"
    return None
