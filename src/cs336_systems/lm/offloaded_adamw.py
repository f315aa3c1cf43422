"""AdamW stepped during backward, one group of parameters (a layer) at a time, whose moments
live in host memory between steps: `OffloadedAdamW`.

A training step whose fp32 weights and AdamW moments fill much of a GPU leaves little room for
activations, and what does not fit is recomputed. The moments (8 bytes a parameter, twice the
fp32 weights) are read only by the update, so between updates they can wait in pinned host
memory. Each offloaded group is updated as soon as backward has made its gradients (after
FSDP's reduce-scatter, where the model is sharded), in the backward's own stream:

    backward starts (`prefetch`)   h2d stream: the first `lookahead` groups' moments -> GPU slots
    group g's gradients are ready  its stream: wait for g's moments; the fused AdamW pass on g;
                                   g's gradients dropped
                                   d2h stream: g's moments -> host; then the next group's
                                   moments -> the slot g used

so the GPU holds `lookahead` groups' moments at a time and each layer's gradient only until its
update, and the copies (16 bytes a parameter each step, over PCIe) overlap the backward's
compute. The update is `FusedAdamW`'s pass (one launch a group), hence bit for bit the same
parameters and moments as `FusedAdamW` stepping after backward. Parameters outside the
offloaded groups (embeddings, head) keep their moments on the GPU and are updated by `step()`.

    groups = [{"params": list(layer.parameters()), "offload": True}
              for layer in reversed(model.layers)] + [{"params": rest}]
    optimizer = OffloadedAdamW(groups, lr=1e-4)
    model.ln_final.register_forward_pre_hook(lambda *_: optimizer.prefetch())
    loss.backward()           # each offloaded group updated here, its gradients dropped
    optimizer.step()          # the rest
    optimizer.zero_grad()

Groups must be given in the order backward completes them (the last layer's first), with one
backward per step (no gradient accumulation). Its `state_dict()` holds the moments (views of
the host buffers); it does not load one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from cs336_systems.kernels.adamw import ALIGN, Plan, local_tensor
from cs336_systems.lm.fused_adamw import FusedAdamW

LOOKAHEAD = 3  # groups whose moments are on the GPU at once


def _padded(n: int, element_size: int = 4) -> int:
    """n elements rounded up so that the next tensor starts ALIGN-byte aligned."""
    step = ALIGN // element_size
    return -(-n // step) * step


@dataclass
class _Group:
    """One offloaded group: its parameters (local shards), its moments on the host (one flat
    buffer, m then v), where each parameter's moments start in it, and this step's progress."""

    params: list[Tensor]               # local shards, for sizes
    options: dict                      # the param group: its parameters and hyperparameters
    host: Tensor
    offsets: list[int]
    numel: int                         # elements of m (and of v) with padding
    step: int = 0
    ready: int = 0                     # parameters whose gradient has arrived this step
    slot: int | None = None            # the GPU slot holding its moments, while fetched
    arrived: object = None             # the event after its moments' copy to the GPU
    saved: object = None               # the event after their last copy back to the host
    plans: dict[int, Plan] = field(default_factory=dict)

    def moments(self, flat: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Views of each parameter's m and v in `flat` (the host buffer or a slot)."""
        views = [[flat[base + o:base + o + p.numel()].view(p.shape)
                  for p, o in zip(self.params, self.offsets)] for base in (0, self.numel)]
        return views[0], views[1]


class OffloadedAdamW(FusedAdamW):
    """`FusedAdamW` whose param groups marked `"offload": True` are stepped in backward with
    their moments on the host (see the module's docstring); `lookahead` slots of GPU memory
    hold the moments of the groups backward reaches next."""

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, lookahead: int = LOOKAHEAD):
        if lookahead < 1:
            raise ValueError(f"lookahead is a number of groups, at least 1; got {lookahead}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self._groups: list[_Group] = []
        self._group_of: dict[Tensor, int] = {}
        for options in self.param_groups:
            if options.get("offload"):
                self._add_group(options)
        if not self._groups:
            raise ValueError("OffloadedAdamW needs param groups marked \"offload\": True")
        self.device = local_tensor(self._groups[0].params[0]).device
        cuda = self.device.type == "cuda"
        size = 2 * max(g.numel for g in self._groups)
        self._slots = [torch.zeros(size, device=self.device)
                       for _ in range(min(lookahead, len(self._groups)))]
        self._free: list[tuple[int, object]] = [(i, None) for i in range(len(self._slots))]
        self._h2d = torch.cuda.Stream(self.device) if cuda else None
        self._d2h = torch.cuda.Stream(self.device) if cuda else None
        self._next = 0                 # the next group to fetch this step

    def _add_group(self, options: dict) -> None:
        params = options["params"]
        for p in params:
            if p.dtype != torch.float32:
                raise ValueError(f"offloaded groups hold fp32 parameters; got {p.dtype}")
            if p in self._group_of:
                raise ValueError("a parameter is in two offloaded groups")
        offsets, numel = [], 0
        for p in params:
            offsets.append(numel)
            numel += _padded(local_tensor(p).numel())
        device = local_tensor(params[0]).device
        host = torch.zeros(2 * numel, pin_memory=device.type == "cuda")
        group = _Group([local_tensor(p) for p in params], options, host, offsets, numel)
        index = len(self._groups)
        self._groups.append(group)
        exp_avgs, exp_avg_sqs = group.moments(host)
        for p, m, v in zip(params, exp_avgs, exp_avg_sqs):
            self._group_of[p] = index
            # the moments as torch keeps them (state_dict, inspection); the update uses slots
            self.state[p] = {"step": 0, "exp_avg": m, "exp_avg_sq": v, "offloaded": True}
            p.register_post_accumulate_grad_hook(self._on_grad)

    def _stream(self, stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    @torch.no_grad()
    def prefetch(self) -> None:
        """Start a step: fetch the moments of the first groups backward will reach. Call it late
        in the forward (a forward pre-hook of the final norm), so that they sit on the GPU only
        briefly; without it the first group's moments are fetched when its gradients arrive."""
        self._fill(0)

    def _fill(self, start: int) -> None:
        """Fetch groups from `start` on, in order, into the free slots."""
        self._next = start
        while self._free and self._next < len(self._groups):
            if self._groups[self._next].slot is None:
                self._fetch(self._next)
            self._next += 1

    def _fetch(self, index: int) -> None:
        """Copy group `index`'s moments into a free slot, after that slot's last copy out."""
        group = self._groups[index]
        slot, freed = self._free.pop(0)
        if self._h2d is not None:  # the slot's last copy out, and this group's
            for event in (freed, group.saved):
                if event is not None:
                    self._h2d.wait_event(event)
        with self._stream(self._h2d):
            self._slots[slot][:2 * group.numel].copy_(group.host, non_blocking=True)
            group.arrived = self._h2d.record_event() if self._h2d is not None else None
        group.slot = slot

    @torch.no_grad()
    def _on_grad(self, param: Tensor) -> None:
        index = self._group_of[param]
        group = self._groups[index]
        group.ready += 1
        if group.ready == len(group.params):
            group.ready = 0
            self._update(index)

    def _update(self, index: int) -> None:
        """Group `index`'s AdamW step in the current stream (the one its gradients were made
        in), then its moments back to the host and its slot to the next group."""
        group = self._groups[index]
        if group.slot is None:  # not prefetched: fetch it (and those after it) now
            if not self._free:
                raise RuntimeError("a group's gradients arrived while every slot held another "
                                   "group's moments: give the groups in the order backward "
                                   "completes them (the last layer's first)")
            self._fill(index)
        cuda = self._h2d is not None
        if cuda:
            torch.cuda.current_stream(self.device).wait_event(group.arrived)
        slot = group.slot
        owners = group.options["params"]
        params = [local_tensor(p) for p in owners]
        exp_avgs, exp_avg_sqs = group.moments(self._slots[slot])
        plan = group.plans.get(slot)
        if plan is None or plan.key != Plan.describe(params, exp_avgs, exp_avg_sqs, []):
            plan = group.plans[slot] = Plan(params, exp_avgs, exp_avg_sqs)
        grads = [local_tensor(p.grad) for p in owners]
        group.step += 1
        beta1, beta2 = group.options["betas"]
        plan.step(grads, step=group.step, lr=group.options["lr"], beta1=beta1, beta2=beta2,
                  eps=group.options["eps"], weight_decay=group.options["weight_decay"])
        for p in owners:
            p.grad = None
            self.state[p]["step"] = group.step
        if cuda:
            self._d2h.wait_stream(torch.cuda.current_stream(self.device))
        with self._stream(self._d2h):
            group.host.copy_(self._slots[slot][:2 * group.numel], non_blocking=True)
            freed = self._d2h.record_event() if cuda else None
        group.slot, group.saved = None, freed
        self._free.append((slot, freed))
        self._fill(self._next)

    def load_state_dict(self, state_dict: dict) -> None:
        raise NotImplementedError("OffloadedAdamW keeps its moments in pinned host buffers that "
                                  "torch's load_state_dict would replace; it does not load state")

    @torch.no_grad()
    def step(self, closure=None):
        """Update the parameters outside the offloaded groups (theirs were updated in backward);
        an offloaded group still holding gradients here (backward ran without its hooks, as
        under `torch.no_grad` nothing does) is an error rather than a silent skip."""
        for group in self._groups:
            if group.ready or any(p.grad is not None for p in group.options["params"]):
                raise RuntimeError("an offloaded group holds gradients at step(): its "
                                   "parameters' post-accumulate-grad hooks did not all run in "
                                   "backward (every parameter of a group needs a gradient)")
        return super().step(closure)
