"""What one module's forward saves for backward, eager or compiled, counted against the
analytic count, and what its backward produces (the CLI: `count_saved`)."""

from __future__ import annotations

import dataclasses
import logging

import torch

from cs336_systems.analysis.memory_model import block_gradient_bytes, block_residuals
from cs336_systems.lm.attention import get_attention
from cs336_systems.lm.model import (
    MODEL_SIZES,
    ModelSize,
    RMSNorm,
    RotaryEmbedding,
    TransformerBlock,
)
from cs336_systems.lm.precision import autocast_context
from cs336_systems.measure.memory import GIB, allocated_gib, peak_gib, reset_peak
from cs336_systems.measure.saved_tensors import (
    COMPILED_METHOD,
    METHOD,
    WALK_METHOD,
    SavedTensors,
    compile_keeping_graphs,
    gradient_bytes,
)
from cs336_systems.measure.timing import synchronize
from cs336_systems.pipeline.records import is_out_of_memory

TARGETS = ("rmsnorm", "block")
VARIANTS = ("eager", "compiled")
# What an eager RMSNorm saves, in the analytic model's names: its entries in a block.
RMSNORM_ENTRIES = ("block input (RMSNorm 1's x)", "RMSNorm 1: rsqrt(mean x^2)",
                   "RMSNorm 1: x * rms")

log = logging.getLogger("cs336_systems")


def block_spec(config: dict) -> ModelSize:
    """The size's shape with the heads this job uses."""
    return dataclasses.replace(MODEL_SIZES[config["size"]], num_heads=config["num_heads"])


def build(config: dict, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    """The module and its input (batch, context, d_model), requiring its gradient."""
    torch.manual_seed(config["seed"])
    seq = config["context_length"]
    if config["target"] == "rmsnorm":
        module = RMSNorm(config["d_model"], device=device)
    else:
        spec = block_spec(config)
        rope = RotaryEmbedding(spec.d_model // spec.num_heads, seq, device=device)
        module = TransformerBlock(spec.d_model, spec.num_heads, spec.d_ff, rope,
                                  get_attention("eager"), device=device)
    x = torch.randn(config["batch_size"], seq, config["d_model"], device=device,
                    requires_grad=True)
    return module, x


def analytic(config: dict) -> dict:
    """memory_model's values for this job: saved bytes by entry, and the block's gradients."""
    batch, seq = config["batch_size"], config["context_length"]
    if config["target"] == "rmsnorm":
        spec = ModelSize(d_model=config["d_model"], d_ff=config["d_model"], num_layers=1,
                         num_heads=1)
        entries = block_residuals(spec, batch, seq)
        return {"analytic_saved": {name: entries[name] for name in RMSNORM_ENTRIES},
                "analytic_gradient": None}
    spec = block_spec(config)
    return {"analytic_saved": block_residuals(spec, batch, seq),
            "analytic_gradient": block_gradient_bytes(spec, batch, seq)}


def counted_forward(run, x: torch.Tensor, module: torch.nn.Module, graphs: list, autocast,
                    device: torch.device, hooks: bool = True):
    """One forward under `SavedTensors`: its output, the account, the allocator's peak during
    it (GiB) and the bytes it left allocated (None on a CPU)."""
    synchronize(device)
    reset_peak(device)
    before = allocated_gib(device)
    with autocast(), SavedTensors(module, hooks=hooks) as saved:
        out = run(x)
    synchronize(device)
    peak, after = peak_gib(device), allocated_gib(device)
    held = None if after is None else round((after - before) * GIB)
    return out, saved.account(out, graphs), peak, held


def measure(config: dict, device: torch.device) -> dict:
    module, x = build(config, device)
    run, graphs = module, []
    autocast = lambda: autocast_context(device, config["precision"])  # noqa: E731
    if config["variant"] == "compiled":
        run, graphs = compile_keeping_graphs(module)
        with autocast():                               # compiles forward and backward
            out = run(x)
        out.backward(torch.randn_like(out))
        log.info("compiled: %d forward graph(s)", len(graphs))
    module.zero_grad(set_to_none=True)
    x.grad = None
    compiled_before = len(graphs)

    hooks_error = None
    try:
        out, account, peak, held = counted_forward(run, x, module, graphs, autocast, device)
    except Exception as error:  # noqa: BLE001 - a compiled module that refuses the hooks
        if config["variant"] != "compiled" or is_out_of_memory(error):
            raise
        hooks_error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        log.warning("saved-tensor hooks failed under torch.compile (%s); counting the autograd "
                    "graph's saved tensors instead", hooks_error)
        out, account, peak, held = counted_forward(run, x, module, graphs, autocast, device,
                                                   hooks=False)
    log.info("saved: %d storages, %d bytes", account.saved_count, account.saved_bytes)

    out.backward(torch.randn_like(out))
    gradients = gradient_bytes(module, [x])
    expected = analytic(config)
    fp32 = config["precision"] == "fp32"
    saved_model = sum(expected["analytic_saved"].values())
    gradient_model = expected["analytic_gradient"]
    return {
        "method": WALK_METHOD if hooks_error else
        COMPILED_METHOD if config["variant"] == "compiled" else METHOD,
        "hooks_error": hooks_error,
        **account.metrics(),
        "input_bytes": x.numel() * x.element_size(),
        "input_numel": x.numel(),
        "output_bytes": out.numel() * out.element_size(),
        "compiled_graphs": len(graphs) if config["variant"] == "compiled" else None,
        "recompiled_under_hooks": (len(graphs) > compiled_before
                                   if config["variant"] == "compiled" else None),
        "parameter_gradient_bytes": gradients["parameter gradients"],
        "input_gradient_bytes": gradients["input gradient"],
        "gradient_bytes": sum(gradients.values()),
        **expected,
        "analytic_saved_bytes": saved_model,
        "analytic_gradient_bytes": sum(gradient_model.values()) if gradient_model else None,
        # the analytic model describes eager fp32: agreement is only asked of that
        "saved_agrees": account.saved_bytes == saved_model
        if fp32 and config["variant"] == "eager" else None,
        "gradient_agrees": gradients == gradient_model if fp32 and gradient_model else None,
        "forward_peak_gib": peak,
        "held_after_forward_bytes": held,
    }
