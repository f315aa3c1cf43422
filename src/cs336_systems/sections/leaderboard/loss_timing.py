"""The LM head and its loss alone at the leaderboard's shape: each way of `lm.loss.HEAD_LOSSES`
(the whole logits as the model is written, our chunked loss, Liger's fused linear cross-entropy,
Cut Cross-Entropy) on the same hidden states, head weight and targets, in one process: its
forward+backward time, the memory it adds above its inputs, and its loss and gradients against
the whole logits in fp32 (the CLI: `time_loss`)."""

from __future__ import annotations

import logging

import torch

from cs336_systems.lm.loss import HEAD_LOSSES, head_loss_unavailable_reason, whole_logits_loss
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.sizes import LEADERBOARD_SHAPES
from cs336_systems.measure.memory import GIB, peak_window
from cs336_systems.measure.timing import time_phases
from cs336_systems.pipeline.records import is_out_of_memory

log = logging.getLogger(__name__)


def loss_inputs(config: dict, device: torch.device) -> tuple[torch.Tensor, ...]:
    """hidden (tokens, d) and the head's weight (vocab, d) in the config's precision, both
    needing gradients, and int64 targets, from the config's seed."""
    spec = LEADERBOARD_SHAPES[config["shape"]]
    dtype = PRECISIONS[config["precision"]]
    generator = torch.Generator(device).manual_seed(config["seed"])
    hidden = torch.randn(config["tokens"], spec.d_model, device=device, generator=generator)
    weight = torch.randn(spec.vocab_size, spec.d_model, device=device, generator=generator)
    targets = torch.randint(0, spec.vocab_size, (config["tokens"],), device=device,
                            generator=generator)
    return (hidden.to(dtype).requires_grad_(), (weight * 0.02).to(dtype).requires_grad_(),
            targets)


def reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
              ) -> tuple[float, torch.Tensor, torch.Tensor]:
    """The loss and gradients of the whole logits in fp32 (what every way is checked against)."""
    h, w = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    loss = whole_logits_loss(h, w, targets)
    grad_h, grad_w = torch.autograd.grad(loss, (h, w))
    return float(loss.detach()), grad_h, grad_w


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm().clamp_min(1e-30))


def measure_loss(name: str, inputs: tuple, expected: tuple, config: dict,
                 device: torch.device) -> dict:
    """One way's row: its times, the memory it adds, its errors; or why it did not run."""
    row = {"loss": name, "label": HEAD_LOSSES[name].label}
    if reason := head_loss_unavailable_reason(name, device):
        return {**row, "status": "skipped", "message": reason}
    hidden, weight, targets = inputs
    fn = HEAD_LOSSES[name].fn
    try:
        loss = fn(hidden, weight, targets)
        grad_h, grad_w = torch.autograd.grad(loss, (hidden, weight))
        errors = {"loss_abs_diff": abs(float(loss.detach()) - expected[0]),
                  "grad_hidden_rel_diff": _relative(grad_h, expected[1]),
                  "grad_weight_rel_diff": _relative(grad_w, expected[2])}
        del loss, grad_h, grad_w

        def step():  # gradients returned, not kept: each step starts from the inputs alone
            torch.autograd.grad(fn(hidden, weight, targets), (hidden, weight))

        with peak_window(device, existing=inputs) as peak:
            times = time_phases([("step", step)], device, config["warmup_steps"],
                                config["measure_steps"], total_name=None)
    except Exception as error:  # noqa: BLE001 - an out-of-memory is this way's result
        if not is_out_of_memory(error):
            raise
        log.info("%s: out of memory", name)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {**row, "status": "oom", "message": str(error).splitlines()[0]}
    metrics = {k: v for k, v in times.metrics().items() if "warmup" not in k}
    return {**row, "status": "ok", **errors, **metrics,
            "added_gib": (peak.peak_bytes - peak.start_bytes) / GIB}


def measure(config: dict, device: torch.device) -> dict:
    spec = LEADERBOARD_SHAPES[config["shape"]]
    inputs = loss_inputs(config, device)
    expected = reference(*inputs)
    rows = [measure_loss(name, inputs, expected, config, device) for name in config["losses"]]
    return {"losses": rows, "d_model": spec.d_model, "vocab_size": spec.vocab_size,
            "logits_gib": config["tokens"] * spec.vocab_size * 4 / GIB}
