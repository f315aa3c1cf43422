"""Optimizer state sharding (ZeRO stage 1): each rank keeps state for ~1/world of the parameters.

Every rank holds all parameters and all gradients (averaged as in data parallelism), but each
parameter has one owner rank. A rank steps only the parameters it owns, with a local instance of
the wrapped optimizer (so its Adam moments exist only there), then every parameter is broadcast
from its owner so all replicas hold the updated weights again:

    loss.backward(); <average the gradients>; optimizer.step()   # = local step + broadcasts

Ownership is decided greedily: parameters of a group, largest first, each go to the rank with
the fewest parameter elements so far (ties to the lower rank). It depends only on shapes and
order, so every rank computes the same assignment without communicating.

`self.param_groups` holds every parameter (so `zero_grad` clears all gradients and a scheduler
can set `lr`); hyperparameters are copied to the local optimizer's groups before each step.
`state_dict()` is the base class's, without the local state: checkpointing is not implemented.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cs336_systems.distributed.launch import require_initialized


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params: Iterable, optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any):
        self.rank, self.world_size = require_initialized("ShardedOptimizer")
        self.optimizer_cls, self.optimizer_kwargs = optimizer_cls, kwargs
        self.local_optimizer: torch.optim.Optimizer | None = None  # created with the 1st owned group
        self._owner: dict[nn.Parameter, int] = {}
        self._load = [0] * self.world_size  # parameter elements owned, per rank
        self._local_groups: dict[int, dict] = {}  # index in self.param_groups -> local group
        super().__init__(params, defaults=kwargs)  # calls self.add_param_group per group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)  # validates, fills defaults, appends to param_groups
        group = self.param_groups[-1]
        owned = []
        for p in sorted(group["params"], key=lambda p: -p.numel()):  # stable: ties keep order
            owner = min(range(self.world_size), key=lambda r: (self._load[r], r))
            self._owner[p] = owner
            self._load[owner] += p.numel()
            if owner == self.rank:
                owned.append(p)
        if not owned:
            return
        local_group = {**group, "params": owned}
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local_group], **self.optimizer_kwargs)
        else:
            self.local_optimizer.add_param_group(local_group)
        self._local_groups[len(self.param_groups) - 1] = self.local_optimizer.param_groups[-1]

    def owned_parameters(self) -> list[nn.Parameter]:
        """The parameters whose optimizer state lives on this rank."""
        return [p for group in self.param_groups for p in group["params"]
                if self._owner[p] == self.rank]

    def owner(self, p: nn.Parameter) -> int:
        return self._owner[p]

    def step(self, closure=None, **kwargs):
        """Step the owned parameters, then broadcast every parameter from its owner."""
        loss = None
        if self.local_optimizer is not None:
            for index, local_group in self._local_groups.items():
                local_group.update({k: v for k, v in self.param_groups[index].items()
                                    if k != "params"})
            loss = self.local_optimizer.step(closure, **kwargs)
        elif closure is not None:
            with torch.enable_grad():
                loss = closure()
        handles = [dist.broadcast(p.data, src=self._owner[p], async_op=True)
                   for group in self.param_groups for p in group["params"]]
        for handle in handles:
            handle.wait()
        return loss
