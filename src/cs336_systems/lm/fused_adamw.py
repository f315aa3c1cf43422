"""`FusedAdamW`: the update of `lm.adamw.AdamW` with no temporaries and one launch per
parameter group, each launch a pass of the Triton kernel in `kernels/adamw.py` (whose docstring
gives the update and its memory traffic).

With working copies (`FusedAdamW.hold_masters`), the parameter the model computes with is a
bf16 copy, its fp32 master lives in the optimizer's state, and the same pass writes the copy
from the updated master (2 bytes more per element); the forward then reads bf16 weights and the
backward makes bf16 gradients, where autocast would cast every weight down and every gradient
up each step (6 bytes per element each way).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from cs336_systems.kernels.adamw import Plan, local_tensor
from cs336_systems.lm.adamw import AdamW


class FusedAdamW(AdamW):
    """`AdamW` (same hyperparameters, same update) as one fused Triton pass per parameter
    group and dtype: no temporaries, one launch per step for each. Gradients may be of a lower
    precision than the parameters (bf16 gradients of fp32 masters, where torch allows them);
    with `hold_masters`, parameters are bf16 working copies of fp32 masters kept here."""

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self._plans: dict[tuple, Plan] = {}

    @torch.no_grad()
    def hold_masters(self, params: Iterable[torch.Tensor], dtype: torch.dtype) -> None:
        """Make each of `params` (fp32 parameters of this optimizer) a `dtype` working copy of
        itself: its fp32 value moves into this optimizer's state (`master`, which the update
        steps, as do the moments), the parameter is cast to `dtype` in place (its round to
        nearest), and each step writes it again from the updated master, in the same pass.

        Under autocast to `dtype`, a matmul's weight is then used as it is rather than cast
        down each forward, and its gradient arrives in `dtype` rather than cast up each
        backward; both casts were exact functions of the master and of the gradient, so the
        update is the same (tests/kernels/test_adamw_kernel.py checks it bit for bit). Only
        weights that autocast casts belong here (a matmul's, not a norm's or an embedding's,
        which autocast leaves in fp32)."""
        known = {p for group in self.param_groups for p in group["params"]}
        for p in params:
            if p not in known:
                raise ValueError("hold_masters takes parameters of this optimizer")
            if hasattr(p, "to_local"):
                raise ValueError("hold_masters takes plain tensors, not sharded ones")
            if p.dtype != torch.float32:
                raise ValueError(f"a master is the fp32 parameter; got one of {p.dtype}")
            if self.state[p]:
                raise ValueError("hold_masters comes before the first step")
            self.state[p]["master"] = p.detach().clone()
            p.data = p.data.to(dtype)
        self._plans.clear()

    def _stepped_state(self, p: torch.Tensor) -> dict:
        """As `AdamW`'s, the moments shaped and typed as the master where `p` has one."""
        state = self.state[p]
        if "step" not in state:
            like = state.get("master", p)
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(like, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(like, memory_format=torch.contiguous_format)
        state["step"] += 1
        return state

    def _update_group(self, group: dict, params: list[torch.Tensor]) -> None:
        """`AdamW.step` calls this for each group's parameters that have gradients: one launch
        per (parameter dtype, gradient dtype, device, masters or not, step count)."""
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for p in params:
            if p.grad.is_sparse:
                raise ValueError("FusedAdamW does not take sparse gradients")
            state = self._stepped_state(p)
            kind = (id(group), p.dtype, p.grad.dtype, p.device, "master" in state,
                    state["step"])
            by_kind.setdefault(kind, []).append(p)
        beta1, beta2 = group["betas"]
        for kind, ps in by_kind.items():
            grads = [local_tensor(p.grad) for p in ps]
            self._plan(kind, ps).step(grads, step=kind[-1], lr=group["lr"], beta1=beta1,
                                      beta2=beta2, eps=group["eps"],
                                      weight_decay=group["weight_decay"])

    def _plan(self, kind: tuple, params: list[torch.Tensor]) -> Plan:
        """The kept plan of these parameters, or a new one where they or their state moved."""
        exp_avgs = [local_tensor(self.state[p]["exp_avg"]) for p in params]
        exp_avg_sqs = [local_tensor(self.state[p]["exp_avg_sq"]) for p in params]
        copies = None
        if kind[-2]:  # working copies: the update steps the masters and writes the copies
            params, copies = [self.state[p]["master"] for p in params], params
        params = [local_tensor(p) for p in params]
        key = kind[:-1]  # the step count changes every step; the tensors do not
        plan = self._plans.get(key)
        if plan is None or plan.key != Plan.describe(params, exp_avgs, exp_avg_sqs,
                                                     copies or []):
            plan = self._plans[key] = Plan(params, exp_avgs, exp_avg_sqs, copies)
        return plan
