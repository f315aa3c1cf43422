"""AdamW (Loshchilov & Hutter), matching `torch.optim.AdamW`'s update order: the readable
definition, which the fused one (`lm/fused_adamw.py`) matches bit for bit.

For each parameter p with gradient g, at step t:
    p <- p - lr * weight_decay * p                      (decoupled weight decay)
    m <- beta1 * m + (1 - beta1) * g
    v <- beta2 * v + (1 - beta2) * g^2
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)

The update runs as multi-tensor (`torch._foreach_*`) operations over each parameter group, so
a 2.7B-parameter model costs a handful of kernel launches per step rather than one per tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

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
