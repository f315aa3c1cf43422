"""Fully sharded data parallelism (ZeRO stage 3), kept small: parameters, gradients and optimizer
state each live on one rank only, 1/world_size per rank.

Sharding. Every parameter that requires grad is flattened, zero-padded to a multiple of the
world size and cut into world_size equal pieces; rank r keeps piece r as an fp32 "master"
nn.Parameter of shape (padded_numel / world_size,). The shard takes the full parameter's place
in its module (same name, so `named_parameters()` lists shards), hence an optimizer built on
`fsdp.parameters()` keeps state for the shard only: optimizer state is sharded for free, and an
elementwise optimizer (SGD, Adam) on shards is the same as on full tensors. A tied weight (one
Parameter in two modules) becomes one shard in both places. Frozen parameters (requires_grad
False) and buffers stay whole and replicated. All of them are broadcast from rank 0 first.

Units. A unit is a module that directly holds parameters: for the Transformer that is each
Linear, Embedding and RMSNorm, so at most one layer's full weights exist at a time (plus those
re-gathered during backward). Wrapping at this level needs no knowledge of the model's classes
and keeps peak memory lowest; the price is many small collectives.

Forward of a unit (forward pre-hook / post-hook):
    full = all_gather(shards)[:numel].view(shape)     in compute_dtype, if given
    module.__dict__[name] = full     # an instance attribute shadows module._parameters[name],
                                     # so `self.weight` in the module's forward reads `full`
    run the module's forward, with floating inputs cast to compute_dtype
    drop the attribute
The gather is an autograd.Function (`_GatherParam`) whose backward reduce-scatters the full
gradient (in fp32) and divides by the world size: each rank receives the averaged gradient of
its own shard, accumulated into shard.grad.

Backward. Autograd would keep `full` alive as a saved tensor (a Linear saves its weight for
grad_input) until backward. While a unit runs forward, a saved-tensors hook replaces any saved
tensor that lives in a gathered weight's storage with a note (shard, size, stride, offset); when
backward needs it, the note is unpacked by gathering the weight again. So full weights are freed
after each unit's forward and re-gathered in backward.

Limitations: collectives are blocking (no prefetch of the next unit, no overlap with compute);
every rank must run the same forward and backward; the gathered weight must not be modified in
place; top-level tensor arguments only are cast to compute_dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from cs336_systems.distributed.launch import require_initialized
from cs336_systems.distributed.naive import broadcast_parameters

# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (same signatures) and warns
# on the old names; older releases (2.11) only have the old ones. Both work on gloo and nccl.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True, eq=False)
class _ShardSpec:
    """How one parameter is cut: its full shape and the length of each rank's piece."""
    shape: torch.Size
    numel: int
    shard_numel: int  # padded numel / world_size
    world_size: int
    param_dtype: torch.dtype  # dtype of the gathered full weight used in compute

    def gather(self, shard: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """All ranks' pieces -> the full parameter, `shape`, a view of a new padded buffer."""
        piece = shard.detach().to(dtype or self.param_dtype)  # (shard_numel,)
        buffer = piece.new_empty(self.shard_numel * self.world_size)  # (padded numel,)
        _all_gather(buffer, piece)
        return buffer[: self.numel].view(self.shape)

    def reduce_scatter(self, grad_full: Tensor) -> Tensor:
        """Full gradient on every rank -> this rank's piece of the average, fp32."""
        flat = grad_full.to(torch.float32).reshape(-1)  # (numel,)
        flat = F.pad(flat, (0, self.shard_numel * self.world_size - self.numel))  # (padded,)
        piece = flat.new_empty(self.shard_numel)  # (shard_numel,)
        _reduce_scatter(piece, flat, op=dist.ReduceOp.SUM)
        return piece.div_(self.world_size)


class _GatherParam(torch.autograd.Function):
    """forward: shard -> full parameter (all-gather); backward: full grad -> shard grad."""

    @staticmethod
    def forward(ctx, shard: Tensor, spec: _ShardSpec) -> Tensor:
        ctx.spec = spec
        return spec.gather(shard)

    @staticmethod
    def backward(ctx, grad_full: Tensor):
        return ctx.spec.reduce_scatter(grad_full), None


class _Regather(NamedTuple):
    """A saved tensor that lived in a gathered weight: gather again, then take the same view."""
    shard: Tensor
    spec: _ShardSpec
    size: torch.Size
    stride: tuple[int, ...]
    storage_offset: int


def _pack(gathered: dict[int, tuple[Tensor, _ShardSpec]], saved: Tensor):
    entry = gathered.get(saved.untyped_storage().data_ptr())
    if entry is None or saved.dtype != entry[1].param_dtype:
        return saved  # an activation, or anything else: keep it as autograd would
    shard, spec = entry
    return _Regather(shard, spec, saved.size(), saved.stride(), saved.storage_offset())


def _unpack(packed):
    if isinstance(packed, _Regather):
        full = packed.spec.gather(packed.shard)
        return full.as_strided(packed.size, packed.stride, packed.storage_offset)
    return packed


@dataclass(eq=False)
class _Unit:
    """A module holding parameters directly: which of them are shards, which stay whole."""
    sharded: list[tuple[str, nn.Parameter]]
    replicated: list[tuple[str, nn.Parameter]]
    active: list[tuple[list[str], Any]] = field(default_factory=list)  # per running forward


class FSDP(nn.Module):
    """Wrap `module` (already on its device) so its trainable parameters are sharded."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if compute_dtype is not None and not compute_dtype.is_floating_point:
            raise ValueError(f"compute_dtype must be a floating-point dtype, got {compute_dtype}")
        self.rank, self.world_size = require_initialized("FSDP")
        self.module, self.compute_dtype = module, compute_dtype
        broadcast_parameters(module, src=0)

        # One master shard per distinct trainable parameter (named_parameters drops tied copies).
        self._specs: dict[nn.Parameter, _ShardSpec] = {}
        shard_of: dict[int, nn.Parameter] = {}  # id(full parameter) -> its shard
        for p in module.parameters():
            if p.requires_grad:
                shard_of[id(p)] = self._make_shard(p)

        # Put the shard wherever the full parameter was, and hook every unit.
        for submodule in module.modules():
            direct = list(submodule.named_parameters(recurse=False, remove_duplicate=False))
            if not direct:
                continue
            unit = _Unit(sharded=[], replicated=[])
            for name, p in direct:
                if id(p) in shard_of:
                    setattr(submodule, name, shard_of[id(p)])
                    unit.sharded.append((name, shard_of[id(p)]))
                else:
                    unit.replicated.append((name, p))
            submodule.register_forward_pre_hook(partial(self._pre_forward, unit), with_kwargs=True)
            submodule.register_forward_hook(partial(self._post_forward, unit), with_kwargs=True,
                                            always_call=True)

    def _make_shard(self, p: nn.Parameter) -> nn.Parameter:
        shard_numel = -(-p.numel() // self.world_size)  # ceil
        flat = F.pad(p.detach().reshape(-1).float(), (0, shard_numel * self.world_size - p.numel()))
        piece = flat[self.rank * shard_numel: (self.rank + 1) * shard_numel]
        shard = nn.Parameter(piece.clone())  # (shard_numel,), fp32; the full `p` can be freed
        self._specs[shard] = _ShardSpec(p.shape, p.numel(), shard_numel, self.world_size,
                                        self.compute_dtype or p.dtype)
        return shard

    def _cast(self, x):
        if self.compute_dtype is not None and isinstance(x, Tensor) and x.is_floating_point():
            return x.to(self.compute_dtype)
        return x

    def _pre_forward(self, unit: _Unit, module: nn.Module, args: tuple, kwargs: dict):
        full = {name: _GatherParam.apply(shard, self._specs[shard]) for name, shard in unit.sharded}
        if self.compute_dtype is not None:  # frozen weights must match the compute dtype too
            full.update({name: self._cast(p.detach()) for name, p in unit.replicated})
        module.__dict__.update(full)  # shadows module._parameters for attribute lookup
        gathered = {full[name].untyped_storage().data_ptr(): (shard, self._specs[shard])
                    for name, shard in unit.sharded}
        hooks = torch.autograd.graph.saved_tensors_hooks(partial(_pack, gathered), _unpack)
        hooks.__enter__()
        unit.active.append((list(full), hooks))
        return tuple(self._cast(a) for a in args), {k: self._cast(v) for k, v in kwargs.items()}

    def _post_forward(self, unit: _Unit, module: nn.Module, args, kwargs, output):
        names, hooks = unit.active.pop()
        hooks.__exit__(None, None, None)
        for name in names:
            del module.__dict__[name]  # free the full weights (saved ones are notes now)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Nothing to wait for: shard gradients are reduced when backward returns. Here so that
        training loops can treat FSDP, DDP and DDPBucketed alike."""

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, Tensor]:
        """Every parameter of the wrapped module by name (tied ones once), full shape, fp32 for
        the sharded ones. A collective: all ranks must call it."""
        return {name: self._specs[p].gather(p, torch.float32) if p in self._specs
                else p.detach().clone()
                for name, p in self.module.named_parameters()}
