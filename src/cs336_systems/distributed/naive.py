"""Naive data parallelism: explicit, blocking collectives called between backward and step.

A training step on every rank is

    broadcast_parameters(model)              # once, before training: all replicas start equal
    loss = loss_fn(model(local_batch)); loss.backward()
    allreduce_gradients_flat(model)          # or allreduce_gradients_individually(model)
    optimizer.step()

With the loss a mean over each rank's (equal-sized) shard of the batch, the averaged gradient is
the full-batch gradient, so every replica takes the same step as single-process training.
Nothing overlaps with the backward pass; that is what `DDP` and `DDPBucketed` add.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cs336_systems.distributed.launch import require_initialized


def broadcast_parameters(module: nn.Module, src: int = 0) -> None:
    """Overwrite every parameter and buffer with rank `src`'s values (in place)."""
    require_initialized("broadcast_parameters")
    with torch.no_grad():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            dist.broadcast(tensor, src=src)


def trainable_gradients(module: nn.Module) -> list[torch.Tensor]:
    """The .grad of each parameter that requires grad (deduplicated), zeros where backward left
    none, so that every rank reduces the same list of tensors in the same order."""
    grads = []
    for p in module.parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    return grads


def allreduce_gradients_individually(module: nn.Module) -> None:
    """One blocking all-reduce per parameter gradient, then divide by the world size."""
    _, world_size = require_initialized("allreduce_gradients_individually")
    for grad in trainable_gradients(module):
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        grad.div_(world_size)


def allreduce_gradients_flat(module: nn.Module) -> None:
    """Copy all gradients into one flat buffer, all-reduce it once, copy the averages back.

    One large message instead of many small ones: the per-call latency is paid once.
    """
    _, world_size = require_initialized("allreduce_gradients_flat")
    grads = trainable_gradients(module)
    if not grads:
        return
    if len({(g.dtype, g.device) for g in grads}) > 1:
        raise ValueError("allreduce_gradients_flat needs gradients of one dtype and device; "
                         "use allreduce_gradients_individually for mixed ones")
    flat = _flatten_dense_tensors(grads)  # (sum of numels,)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(world_size)
    for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(averaged)
