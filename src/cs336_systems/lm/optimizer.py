"""AdamW (Loshchilov & Hutter), matching `torch.optim.AdamW`'s update order.

For each parameter p with gradient g, at step t:
    p <- p - lr * weight_decay * p                      (decoupled weight decay)
    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)

The update runs as multi-tensor (`torch._foreach_*`) operations over each parameter group, so
a 2.7B-parameter model costs a handful of kernel launches per step rather than one per tensor;
it is the readable definition. `OPTIMIZERS` names the ones a training job can take: this one,
the same update fused into one Triton pass (`kernels/adamw.py`), and torch's fused AdamW.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor


class AdamW(torch.optim.Optimizer):
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        if lr < 0:
            raise ValueError(f"lr must be non-negative, got {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update_group(group, params)
        return loss

    def _stepped_state(self, p: Tensor) -> dict:
        """`p`'s state, created at its first step (both moments zero), its step counted."""
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        state["step"] += 1
        return state

    def _update_group(self, group: dict, params: list[Tensor]) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        for p in params:
            self._stepped_state(p)
        # Parameters of one group share a step count unless added mid-training; group by it.
        by_step: dict[int, list[Tensor]] = {}
        for p in params:
            by_step.setdefault(self.state[p]["step"], []).append(p)
        for step, ps in by_step.items():
            grads = [p.grad for p in ps]
            exp_avgs = [self.state[p]["exp_avg"] for p in ps]
            exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in ps]
            if wd != 0:
                torch._foreach_mul_(ps, 1 - lr * wd)
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)  # m += (1 - beta1) * (g - m)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            denom = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_div_(denom, math.sqrt(bias_correction2))
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(ps, exp_avgs, denom, value=-lr / bias_correction1)


@dataclass(frozen=True)
class OptimizerChoice:
    """One optimizer of the registry: how to build it, its label in tables, and the kernel
    module it imports lazily (which a rule running it lists as a source)."""

    cls: Callable[[], Callable[..., torch.optim.Optimizer]]
    label: str
    modules: tuple[str, ...] = ()
    # steps each layer in backward: built over one param group per layer (`layer_groups`)
    per_layer: bool = False


def _fused_adamw() -> Callable[..., torch.optim.Optimizer]:
    from cs336_systems.kernels.adamw import FusedAdamW  # Triton only when used
    return FusedAdamW


def _offloaded_adamw() -> Callable[..., torch.optim.Optimizer]:
    from cs336_systems.lm.offloaded_adamw import OffloadedAdamW
    return OffloadedAdamW


# The optimizers, all AdamW with the same hyperparameters: ours written out, ours fused in
# Triton, the fused one stepping each layer in backward with its moments in host memory between
# steps (the leaderboard's), and torch's fused CUDA kernel. A training job takes one of
# `FLAT_OPTIMIZERS`.
OPTIMIZERS: dict[str, OptimizerChoice] = {
    "adamw": OptimizerChoice(lambda: AdamW, "AdamW (foreach)"),
    "adamw-fused": OptimizerChoice(_fused_adamw, "AdamW (fused Triton)",
                                   ("cs336_systems.kernels.adamw",)),
    "adamw-offloaded": OptimizerChoice(
        _offloaded_adamw, "AdamW (fused Triton, in backward, moments on the host)",
        ("cs336_systems.kernels.adamw", "cs336_systems.lm.offloaded_adamw"), per_layer=True),
    "torch-adamw-fused": OptimizerChoice(lambda: partial(torch.optim.AdamW, fused=True),
                                         "torch AdamW (fused)"),
}


# The optimizers that take any list of parameters: every training job's choice (config key
# `optimizer`). A per-layer one needs the model's layers, and its gradients whole in backward
# (not DDP's, which are averaged after it), so only the leaderboard's job builds it.
FLAT_OPTIMIZERS: tuple[str, ...] = tuple(n for n, c in OPTIMIZERS.items() if not c.per_layer)


def _choice(name: str) -> OptimizerChoice:
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def optimizer_class(name: str) -> Callable[..., torch.optim.Optimizer]:
    """What builds optimizer `name`: call it as `(params, lr=..., weight_decay=...)`."""
    return _choice(name).cls()


def build_optimizer(name: str, params: Iterable, lr: float = 1e-4, **hyperparameters
                    ) -> torch.optim.Optimizer:
    return optimizer_class(name)(params, lr=lr, **hyperparameters)


def layer_groups(root: torch.nn.Module, layers: Sequence[torch.nn.Module]) -> list[dict]:
    """`root`'s parameters as param groups for a `per_layer` optimizer: each of `layers`'
    (given in forward order) a group marked "offload", the last layer's first (the order
    backward completes them), then one group of the rest (embeddings, final norm, head)."""
    groups = [{"params": list(layer.parameters()), "offload": True}
              for layer in reversed(layers)]
    in_layers = {p for group in groups for p in group["params"]}
    rest = [p for p in root.parameters() if p not in in_layers]
    return groups + ([{"params": rest}] if rest else [])


def is_per_layer(name: str) -> bool:
    return _choice(name).per_layer


def runs_triton(name: str) -> bool:
    """Whether optimizer `name` runs a Triton kernel (on a CPU: Triton's interpreter)."""
    return "cs336_systems.kernels.adamw" in _choice(name).modules


def optimizer_label(name: str) -> str:
    return OPTIMIZERS[name].label if name in OPTIMIZERS else name


def optimizer_modules(name: str) -> list[str]:
    """Package modules a job running `name` imports lazily, for its rule's source inputs."""
    return list(_choice(name).modules)
