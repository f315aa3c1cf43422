"""Fully sharded data parallelism (ZeRO stage 3), kept small: `FSDP(module, compute_dtype=None)`.

What is sharded. The weight of every Linear and Embedding layer, recognised by what it is: a
module that is an nn.Linear or nn.Embedding (or a subclass), or whose class name ends in "Linear"
or "Embedding" (this project's model.Linear and model.Embedding, a user's LoRALinear), and whose
`weight` is a 2-D parameter (so model.RotaryEmbedding, which holds buffers only, and
nn.Bilinear, whose weight is 3-D, are left whole). Rank r keeps rows [r k, (r + 1) k) of it,
k = ceil(rows / world_size), zero-padded at the end, as an fp32 nn.Parameter (the master) that
takes the weight's place in its module under the same name. So `named_parameters()` lists the
shard, an optimizer built on `fsdp.parameters()` keeps state for it alone, and an elementwise
optimizer (SGD, AdamW) steps each row of it exactly as it would step the full weight. A weight
tied between two modules is one shard in both; frozen weights are sharded too.

Everything else (norms, biases, any other parameter) stays whole on every rank, and its
gradient is averaged by an asynchronous all-reduce launched from a post-accumulate-grad hook, as
in DDP, so every rank holds the same one. Parameters and buffers are broadcast from rank 0 first.

Forward. Each call of a module that holds a shard is a "use". The all-gather of use i's weights
(cast to compute_dtype before it is sent, if given) is started asynchronously once use i - 2 has
finished its forward, following the order in which the previous forward ran its uses (the first
forward gathers each use when it starts). The module's forward pre-hook waits for it and puts the
full weight in the module's __dict__, which shadows module._parameters, so `self.weight` in its
forward reads the full weight; with compute_dtype it also casts the other parameters and the
floating-point inputs. The forward hook drops the full weight. So while one layer computes, the
next one's weights are on their way, and FSDP holds at most two layers' full weights at a time.

Backward. Autograd would keep each full weight alive as a saved tensor (a Linear saves it for its
input's gradient). During a use's forward, a saved-tensors hook replaces every saved tensor that
lives in a gathered weight with a note (`_Note`); when backward needs it, the note is unpacked
by gathering the weight again, and the gather for the weight saved before it (the next one
backward will need) starts at once: the same window, in reverse, and again at most two full
weights held. A re-gathered weight is freed as soon as autograd is done with it.

Gradients. The full weight reaches the module through `_Gathered`, an identity whose backward
hands the full weight's gradient (as fp32) to FSDP instead of to the shard. The gradients of all
uses of a weight in one forward (a tied embedding and LM head) are summed first; when the last
one has arrived, one asynchronous reduce-scatter sends the sum; with more than REDUCE_WINDOW in
flight the oldest is waited for, so at most that many full gradients are alive at once (on CUDA
the wait orders the compute stream after the collective and costs the CPU nothing).
`finish_gradient_synchronization()` waits for every outstanding collective and writes the average into each shard's .grad, so every
parameter's .grad has its parameter's shape and dtype.

Exactness. A rank's gradient is that of its own rows' mean loss, and FSDP averages them: with 2
ranks that is bitwise what one process gets for the whole batch's mean loss by adding the two
halves' gradients and halving the sum (a sum of two numbers does not depend on their order;
halving is exact). So in fp32 on gloo, FSDP trains exactly as one process that takes the whole
batch as those two halves (tests/distributed/test_fsdp.py), and with compute_dtype exactly as one
that casts each weight where it is used. One backward over the whole batch instead sums each
matmul's rows in another order: the weights then differ in their last bits (up to 1.2e-7 after
three steps of the test's toy model). With more ranks the sum follows the backend's order.

Assumptions (as for DDP): every rank runs the same forward and backward; one backward per
forward run with grad enabled (run evaluation under torch.no_grad()); a gathered weight is not
modified in place; only top-level tensor arguments are cast to compute_dtype; the wrapper's
saved-tensors hook takes over from any outer one while a sharded layer runs (so no activation
checkpointing inside the wrapped module); forwards go through the wrapper (it orders the uses).

Profiling. Each all-gather is issued inside a `record_function` range named
`fsdp.all_gather <weight>` (`fsdp.regather <weight>` in backward), and each use's forward runs
inside `fsdp.forward <module>`, from after its weights arrived until its output, so a trace
shows when each gather ran against when its layer began (`gather_timing`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import record_function

from cs336_systems.distributed.launch import require_initialized
from cs336_systems.distributed.naive import broadcast_parameters
from cs336_systems.measure.collectives import FORWARD_RANGE, GATHER_RANGE

# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (same signatures) and warns
# on the old names; older releases (2.11) only have the old ones. Both work on gloo and nccl.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# Reduce-scatters in flight in backward: past this many, the oldest is waited for, so that its
# full gradient is freed instead of every layer's living until the end of backward.
REDUCE_WINDOW = 2

# The profiler ranges FSDP opens, each followed by a space and the weight's or module's name:
# the gather and forward ranges are the ones `measure.collectives.gather_timing` reads.
REGATHER_RANGE = "fsdp.regather"


def is_sharded_layer(module: nn.Module) -> bool:
    """The sharding rule: a Linear or Embedding layer (by class or by class name) with a 2-D
    `weight` parameter."""
    weight = module._parameters.get("weight")
    named = type(module).__name__.endswith(("Linear", "Embedding"))
    return ((isinstance(module, (nn.Linear, nn.Embedding)) or named)
            and weight is not None and weight.dim() == 2)


@dataclass(eq=False)
class _Shard:
    """One sharded weight: this rank's rows of it, and its gradient while backward runs."""
    param: nn.Parameter  # (k, columns), fp32: rows [rank k, (rank + 1) k) of the padded weight
    name: str  # the weight's qualified name (the first, for a tied one)
    rows: int  # of the full weight
    dtype: torch.dtype  # the full weight's in forward and backward: compute_dtype or its own
    uses: int = 0  # uses in this step's forwards whose gradient has not arrived yet
    full_grad: Tensor | None = None  # (rows, columns) fp32, the sum of those that have


class _Gathering:
    """An all-gather of one shard in flight; `wait()` returns the full weight (rows, columns)."""

    def __init__(self, shard: _Shard, world_size: int, dtype: torch.dtype, label: str):
        self.rows = shard.rows
        with record_function(f"{label} {shard.name}"):
            self.piece = shard.param.detach().to(dtype)  # (k, columns)
            self.buffer = self.piece.new_empty(world_size * self.piece.shape[0],
                                               self.piece.shape[1])
            self.handle = _all_gather(self.buffer, self.piece, async_op=True)

    def wait(self) -> Tensor:
        self.handle.wait()
        return self.buffer[: self.rows]


class _Gathered(torch.autograd.Function):
    """The full weight as a function of the shard: forward passes it through, backward hands
    its gradient to `on_grad` (which reduce-scatters it) instead of to the shard."""

    @staticmethod
    def forward(ctx, shard: Tensor, full: Tensor, on_grad: Callable[[Tensor], None]) -> Tensor:
        ctx.on_grad = on_grad
        return full

    @staticmethod
    def backward(ctx, grad_full: Tensor):
        ctx.on_grad(grad_full)
        return None, None, None


@dataclass(eq=False)
class _Saved:
    """A gathered weight that autograd saved during one use (as notes)."""
    shard: _Shard
    previous: _Saved | None  # the one saved before it in the same forward: backward's next
    unpacked: bool = False


class _Note(NamedTuple):
    """What autograd keeps instead of a saved tensor that lived in a gathered weight."""
    saved: _Saved
    size: torch.Size
    stride: tuple[int, ...]
    storage_offset: int


@dataclass(eq=False)
class _Unit:
    """A module holding parameters directly: its shards and its whole parameters, by name."""
    name: str  # the module's qualified name
    shards: dict[str, _Shard]
    replicated: dict[str, nn.Parameter]
    calls: list = field(default_factory=list)  # (position, names, hooks, range) per running forward


class FSDP(nn.Module):
    """Wrap `module` (already on its device) so the weights of its Linear and Embedding layers
    are sharded across ranks; train it like DDP (backward, finish_gradient_synchronization, step).
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if compute_dtype is not None and not compute_dtype.is_floating_point:
            raise ValueError(f"compute_dtype must be a floating-point dtype, got {compute_dtype}")
        self.rank, self.world_size = require_initialized("FSDP")
        self.module, self.compute_dtype = module, compute_dtype
        broadcast_parameters(module, src=0)
        self._order: list[_Unit] = []  # the uses of the last forward, in order
        self._uses: list[_Unit] = []  # the uses of this forward so far
        self._ahead: dict[tuple[int, _Unit], dict[str, _Gathering]] = {}  # forward prefetches
        self._ahead_backward: dict[_Saved, _Gathering] = {}
        self._last_saved: _Saved | None = None
        self._reductions: list[tuple[_Shard, Tensor, Tensor, dist.Work]] = []
        self._all_reductions: list[dist.Work] = []

        # id(weight) -> its shard, for each distinct weight of a sharded layer (ties share one)
        shard_of: dict[int, _Shard] = {}
        for name, m in module.named_modules():
            if is_sharded_layer(m) and id(m.weight) not in shard_of:
                shard_of[id(m.weight)] = self._make_shard(m.weight, _join(name, "weight"))
        self._units: list[_Unit] = []
        for module_name, submodule in module.named_modules():
            direct = dict(submodule.named_parameters(recurse=False, remove_duplicate=False))
            unit = _Unit(module_name or type(module).__name__,
                         {name: shard_of[id(p)] for name, p in direct.items() if id(p) in shard_of},
                         {name: p for name, p in direct.items() if id(p) not in shard_of})
            self._units.append(unit)
            for name, shard in unit.shards.items():
                setattr(submodule, name, shard.param)  # the shard takes the weight's place
            if unit.shards or (unit.replicated and compute_dtype is not None):
                submodule.register_forward_pre_hook(partial(self._pre_forward, unit),
                                                    with_kwargs=True)
                submodule.register_forward_hook(partial(self._post_forward, unit),
                                                with_kwargs=True, always_call=True)
        self._shards = {id(shard.param): shard for shard in shard_of.values()}
        for p in module.parameters():
            if p.requires_grad and id(p) not in self._shards:
                p.register_post_accumulate_grad_hook(self._on_replicated_grad)

    def _make_shard(self, weight: nn.Parameter, name: str) -> _Shard:
        rows = weight.shape[0]
        k = -(-rows // self.world_size)  # ceil
        padded = F.pad(weight.detach().float(), (0, 0, 0, k * self.world_size - rows))
        piece = padded[self.rank * k: (self.rank + 1) * k].clone()  # the full weight can go
        return _Shard(nn.Parameter(piece, requires_grad=weight.requires_grad), name, rows,
                      self.compute_dtype or weight.dtype)

    def _gather(self, shard: _Shard, dtype: torch.dtype | None = None,
                label: str = GATHER_RANGE) -> _Gathering:
        return _Gathering(shard, self.world_size, dtype or shard.dtype, label)

    def forward(self, *args, **kwargs):
        self._uses, self._last_saved = [], None
        try:
            return self.module(*args, **kwargs)
        finally:
            self._order = self._uses
            for gathers in self._ahead.values():  # prefetched for a use that did not come
                for gathering in gathers.values():
                    gathering.wait()
            self._ahead.clear()

    def _prefetch(self, position: int) -> None:
        """Start gathering the weights of the use at `position` in the last forward's order."""
        if position < len(self._order):
            unit = self._order[position]
            self._ahead[position, unit] = {name: self._gather(shard)
                                           for name, shard in unit.shards.items()}

    def _full_weights(self, unit: _Unit, position: int) -> dict[str, Tensor]:
        """The full weights of the use at `position`: prefetched if the order held, else gathered
        now. The first use also starts the second one's gather (the window's first two)."""
        gathers = self._ahead.pop((position, unit), None)
        if gathers is None:
            gathers = {name: self._gather(shard) for name, shard in unit.shards.items()}
        if position == 0:
            self._prefetch(1)
        return {name: gathering.wait() for name, gathering in gathers.items()}

    def _as_weight(self, shard: _Shard, full: Tensor) -> Tensor:
        """The full weight as the module's forward sees it: its gradient goes to FSDP."""
        if not (torch.is_grad_enabled() and shard.param.requires_grad):
            return full
        shard.uses += 1
        return _Gathered.apply(shard.param, full, partial(self._on_full_grad, shard))

    def _cast(self, x):
        if self.compute_dtype is not None and isinstance(x, Tensor) and x.is_floating_point():
            return x.to(self.compute_dtype)
        return x

    def _pre_forward(self, unit: _Unit, module: nn.Module, args: tuple, kwargs: dict):
        weights, position, hooks = {}, None, None
        if unit.shards:
            position = len(self._uses)
            self._uses.append(unit)
            full = self._full_weights(unit, position)
            storages = {full[name].untyped_storage().data_ptr(): shard
                        for name, shard in unit.shards.items()}
            hooks = torch.autograd.graph.saved_tensors_hooks(
                partial(self._pack, storages, {}), self._unpack)
            hooks.__enter__()
            weights = {name: self._as_weight(shard, full[name])
                       for name, shard in unit.shards.items()}
        if self.compute_dtype is not None:
            weights.update({name: p.to(self.compute_dtype) for name, p in unit.replicated.items()})
        module.__dict__.update(weights)  # shadows module._parameters for attribute lookup
        span = record_function(f"{FORWARD_RANGE} {unit.name}")
        span.__enter__()
        unit.calls.append((position, list(weights), hooks, span))
        return tuple(self._cast(a) for a in args), {k: self._cast(v) for k, v in kwargs.items()}

    def _post_forward(self, unit: _Unit, module: nn.Module, args, kwargs, output):
        position, names, hooks, span = unit.calls.pop()
        span.__exit__(None, None, None)
        for name in names:
            del module.__dict__[name]  # free the full weights (saved ones are notes now)
        if hooks is not None:
            hooks.__exit__(None, None, None)
            self._prefetch(position + 2)

    def _pack(self, storages: dict[int, _Shard], saved: dict[_Shard, _Saved], tensor: Tensor):
        shard = storages.get(tensor.untyped_storage().data_ptr())
        if shard is None:
            return tensor  # an activation, or anything else: keep it as autograd would
        if shard not in saved:
            saved[shard] = self._last_saved = _Saved(shard, previous=self._last_saved)
        return _Note(saved[shard], tensor.size(), tensor.stride(), tensor.storage_offset())

    def _unpack(self, packed):
        if not isinstance(packed, _Note):
            return packed
        saved = packed.saved
        gathering = (self._ahead_backward.pop(saved, None)
                     or self._gather(saved.shard, label=REGATHER_RANGE))
        saved.unpacked = True
        upcoming = saved.previous  # the weight backward needs next: start its gather now
        if upcoming is not None and not upcoming.unpacked and upcoming not in self._ahead_backward:
            self._ahead_backward[upcoming] = self._gather(upcoming.shard, label=REGATHER_RANGE)
        full = gathering.wait()
        return full.as_strided(packed.size, packed.stride, packed.storage_offset)

    def _on_full_grad(self, shard: _Shard, grad_full: Tensor) -> None:
        """One use's gradient of the full weight: add it up; after the last, reduce-scatter."""
        grad = grad_full.float()
        shard.full_grad = grad if shard.full_grad is None else shard.full_grad + grad
        shard.uses -= 1
        if shard.uses == 0:
            k = shard.param.shape[0]
            padded = F.pad(shard.full_grad, (0, 0, 0, k * self.world_size - shard.rows))
            piece = padded.new_empty(shard.param.shape)  # (k, columns)
            handle = _reduce_scatter(piece, padded, op=dist.ReduceOp.SUM, async_op=True)
            self._reductions.append((shard, piece, padded, handle))
            shard.full_grad = None
            while len(self._reductions) > REDUCE_WINDOW:  # free the oldest full gradient
                self._finish_reduction(*self._reductions.pop(0))

    def _finish_reduction(self, shard: _Shard, piece: Tensor, padded: Tensor,
                          handle: dist.Work) -> None:
        """Wait for one reduce-scatter (on CUDA: the current stream waits, the CPU does not)
        and make its result the shard's .grad; `padded`, the full gradient, can go after."""
        handle.wait()
        shard.param.grad = piece.div_(self.world_size)

    def _on_replicated_grad(self, p: nn.Parameter) -> None:
        p.grad.div_(self.world_size)  # pre-divide: the sum of the shares is the average
        self._all_reductions.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        """Wait for every outstanding collective (call after backward, before the optimizer's
        step); each shard's .grad is then its rows of the gradient averaged over ranks, fp32."""
        for reduction in self._reductions:
            self._finish_reduction(*reduction)
        for handle in self._all_reductions:
            handle.wait()
        for gathering in self._ahead_backward.values():  # prefetched for a backward that
            gathering.wait()                              # never needed it
        self._reductions.clear()
        self._all_reductions.clear()
        self._ahead_backward.clear()
        waiting = [shard for shard in self._shards.values() if shard.uses]
        for shard in waiting:
            shard.uses, shard.full_grad = 0, None
        if waiting:
            raise RuntimeError(f"{len(waiting)} sharded weights got no gradient from a forward "
                               "run with grad enabled; run forwards you do not train on under "
                               "torch.no_grad()")

    def sharded_weights(self) -> dict[str, list[str]]:
        """The modules holding sharded weights and those weights' names, as the profiler
        ranges name them (`FORWARD_RANGE <module>`, `GATHER_RANGE <weight>`)."""
        return {unit.name: [shard.name for shard in unit.shards.values()]
                for unit in self._units if unit.shards}

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, Tensor]:
        """Every parameter of the wrapped module by name (tied ones once), full shape, fp32 for
        the sharded ones. A collective: all ranks must call it."""
        return {name: self._gather(self._shards[id(p)], torch.float32).wait().clone()
                if id(p) in self._shards else p.detach().clone()
                for name, p in self.module.named_parameters()}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def sharding_breakdown(module: nn.Module) -> dict[str, int]:
    """What FSDP's rule shards of `module` and what it keeps whole: parameters and bytes of
    each (every distinct parameter once, at its own dtype), and the largest sharded weight."""
    sharded = {id(m.weight): m.weight for m in module.modules() if is_sharded_layer(m)}
    whole = [p for p in module.parameters() if id(p) not in sharded]
    return {"sharded_parameters": sum(p.numel() for p in sharded.values()),
            "sharded_bytes": sum(p.numel() * p.element_size() for p in sharded.values()),
            "sharded_weights": len(sharded),
            "replicated_parameters": sum(p.numel() for p in whole),
            "replicated_bytes": sum(p.numel() * p.element_size() for p in whole),
            "largest_sharded_bytes": max((p.numel() * p.element_size()
                                          for p in sharded.values()), default=0)}
