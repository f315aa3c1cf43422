"""Data parallelism that overlaps gradient communication with the backward pass.

Both wrappers broadcast rank 0's parameters and buffers at construction and register a
post-accumulate-grad hook on every parameter that requires grad. Autograd calls such a hook once
per backward pass per tensor, after *all* contributions to its .grad have been summed: a weight
used twice (tied embedding and LM head) fires it once, with the total. The hook launches an
asynchronous all-reduce, so communication of the last layers' gradients runs while autograd
still computes the first layers' ones. A step is

    loss.backward()                          # hooks launch all-reduces as gradients appear
    model.finish_gradient_synchronization()  # wait for them; grads now hold the average
    optimizer.step()

`DDP` sends one all-reduce per parameter; `DDPBucketed` groups parameters into buckets of about
`bucket_size_mb` and sends one all-reduce per bucket (fewer, larger messages).

Assumptions (as in torch's DDP without find_unused_parameters): one backward per step, and every
parameter that requires grad receives a gradient in every step on every rank, so that all ranks
launch the same collectives in the same order.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cs336_systems.distributed.launch import require_initialized
from cs336_systems.distributed.naive import broadcast_parameters


def _trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that require grad, each once (module.parameters() drops tied duplicates)."""
    return [p for p in module.parameters() if p.requires_grad]


class DDP(nn.Module):
    """One asynchronous all-reduce per parameter, launched as soon as its gradient is ready."""

    def __init__(self, module: nn.Module):
        super().__init__()
        _, self.world_size = require_initialized("DDP")
        self.module = module
        broadcast_parameters(module, src=0)
        self._handles: list[dist.Work] = []
        for p in _trainable_parameters(module):
            p.register_post_accumulate_grad_hook(self._on_gradient_ready)

    def _on_gradient_ready(self, p: nn.Parameter) -> None:
        p.grad.div_(self.world_size)  # pre-divide: the sum of the shares is the average
        self._handles.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Block until every launched all-reduce is done (call after backward, before step)."""
        for handle in self._handles:
            handle.wait()
        self._handles.clear()


def assign_buckets(params: list[nn.Parameter], bucket_size_bytes: float
                   ) -> list[list[nn.Parameter]]:
    """Split `params`, in the given order, into consecutive buckets of at most
    `bucket_size_bytes`. A parameter that would overflow the current bucket starts a new one (so
    one larger than a bucket sits alone), and so does a change of dtype or device, since a
    bucket is flattened into one buffer."""
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        last = buckets[-1][-1] if buckets else None
        if last is not None and size + nbytes <= bucket_size_bytes and (
                last.dtype, last.device) == (p.dtype, p.device):
            buckets[-1].append(p)
            size += nbytes
        else:
            buckets.append([p])
            size = nbytes
    return buckets


class DDPBucketed(nn.Module):
    """One asynchronous all-reduce per bucket of parameters, launched when the bucket is full.

    Buckets are filled in reverse `module.parameters()` order, the order in which backward
    roughly produces gradients (the output layer first), so the first bucket can be sent while
    most of the backward pass is still to run. Per step, each bucket counts its parameters'
    hooks; the last one flattens the bucket's gradients into a buffer (a copy) and all-reduces
    it. `finish_gradient_synchronization` waits and copies the averages back into each .grad.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float):
        super().__init__()
        if not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be positive, got {bucket_size_mb}")
        _, self.world_size = require_initialized("DDPBucketed")
        self.module = module
        broadcast_parameters(module, src=0)
        params = _trainable_parameters(module)[::-1]
        self.buckets = assign_buckets(params, bucket_size_mb * 1024**2)
        self._pending = [len(bucket) for bucket in self.buckets]  # hooks still to fire, per bucket
        # (bucket index, flat buffer, handle) of the all-reduces in flight
        self._in_flight: list[tuple[int, torch.Tensor, dist.Work]] = []
        for index, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(partial(self._on_gradient_ready, index))

    def _on_gradient_ready(self, index: int, p: nn.Parameter) -> None:
        self._pending[index] -= 1
        if self._pending[index] == 0:
            flat = _flatten_dense_tensors([q.grad for q in self.buckets[index]])  # (bucket numel,)
            flat.div_(self.world_size)
            handle = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
            self._in_flight.append((index, flat, handle))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce, write the averages into .grad, reset the counts."""
        for index, flat, handle in self._in_flight:
            handle.wait()
            grads = [p.grad for p in self.buckets[index]]
            for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(averaged)
        self._in_flight.clear()
        self._pending = [len(bucket) for bucket in self.buckets]
