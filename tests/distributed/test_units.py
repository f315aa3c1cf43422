"""Pieces of the distributed library checked in this process: bucketing, the autograd hook
semantics DDP relies on, input validation, FSDP's sharding rule, and its sharding and freeing
on a 1-rank group."""

from __future__ import annotations

import datetime
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn

from cs336_systems.distributed import (
    DDP,
    FSDP,
    DDPBucketed,
    ShardedOptimizer,
    allreduce_gradients_flat,
    assign_buckets,
    broadcast_parameters,
    free_port,
)
from cs336_systems.distributed import fsdp as fsdp_module
from cs336_systems.lm import model as lm
from support.distributed import ToyModel, batches, loss_fn


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_assign_buckets_fills_in_order_and_isolates_large_parameters():
    sizes = [10, 20, 30, 100, 5, 5]  # fp32: 4 bytes per element
    params = [nn.Parameter(torch.randn(n)) for n in sizes]
    buckets = assign_buckets(params, bucket_size_bytes=4 * 50)
    assert [[p.numel() for p in b] for b in buckets] == [[10, 20], [30], [100], [5, 5]]
    half = nn.Parameter(torch.randn(3, dtype=torch.float16))
    assert len(assign_buckets([params[0], half], bucket_size_bytes=1e9)) == 2  # dtype splits


def test_post_accumulate_grad_hook_fires_once_for_a_tied_weight_with_the_total_gradient():
    model = ToyModel()
    seen = []
    model.embed.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    tokens, targets = next(batches(1))
    loss_fn(model, tokens, targets).backward()
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], model.embed.weight.grad)
    # The total really has two parts: with the head's use of the weight detached, the
    # gradient (the embedding's part alone) differs from what the hook saw.
    model.head.forward = lambda x: torch.nn.functional.linear(x, model.head.weight.detach())
    embed_part = torch.autograd.grad(loss_fn(model, tokens, targets), model.embed.weight)[0]
    assert not torch.allclose(embed_part, seen[0])


def test_constructors_reject_bad_input():
    with pytest.raises(ValueError, match="bucket_size_mb"):
        DDPBucketed(ToyModel(), bucket_size_mb=0)
    with pytest.raises(ValueError, match="compute_dtype"):
        FSDP(ToyModel(), compute_dtype=torch.int32)
    for make in (lambda: DDP(ToyModel()), lambda: DDPBucketed(ToyModel(), 1.0),
                 lambda: FSDP(ToyModel()), lambda: broadcast_parameters(ToyModel()),
                 lambda: allreduce_gradients_flat(ToyModel()),
                 lambda: ShardedOptimizer(ToyModel().parameters(), torch.optim.SGD, lr=0.1)):
        with pytest.raises(ValueError, match="initialized"):
            make()


def test_fsdp_shards_the_weights_of_linear_and_embedding_layers_only():
    class UserEmbedding(nn.Module):  # a user's own class: recognised by its name
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(5, 3))

    class Projection(nn.Linear):  # a subclass of nn.Linear: recognised by its base
        pass

    class Scale(nn.Module):  # a 2-D weight, but neither a Linear nor an Embedding
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(3, 3))

    sharded = [nn.Linear(3, 4), nn.Embedding(5, 3), lm.Linear(3, 4), lm.Embedding(5, 3),
               UserEmbedding(), Projection(3, 4)]
    whole = [lm.RMSNorm(3), nn.LayerNorm(3), lm.RotaryEmbedding(4, 8), nn.Bilinear(3, 3, 2),
             Scale(), nn.Conv1d(3, 3, 1)]
    assert all(fsdp_module.is_sharded_layer(m) for m in sharded)
    assert not any(fsdp_module.is_sharded_layer(m) for m in whole)


def test_fsdp_shards_frees_regathers_and_matches_plain_gradients(one_rank_group, monkeypatch):
    torch.manual_seed(0)
    plain = ToyModel()
    copy = _copy_of(plain)
    originals = dict(copy.named_parameters())
    model = FSDP(copy)
    inner = model.module
    # Linear and Embedding weights, frozen ones too, become fp32 shards (all rows, on one rank),
    # one for the tied weight; biases stay the very same parameters.
    for name, p in inner.named_parameters():
        assert (p is originals[name]) == name.endswith("bias"), name
        assert p.shape == originals[name].shape and p.dtype == torch.float32, name
    assert inner.head.weight is inner.embed.weight
    assert not inner.frozen.weight.requires_grad

    # The full weight exists during the unit's forward only, even though autograd needs it.
    full_fc1 = []  # a weak reference to the gathered weight, taken inside fc1's forward
    inner.fc1.register_forward_hook(lambda m, args, out: full_fc1.append(weakref.ref(m.weight)),
                                    prepend=True)  # runs before FSDP's post-forward hook
    gathers = []
    counting = fsdp_module._all_gather
    monkeypatch.setattr(fsdp_module, "_all_gather", lambda out, inp, async_op: (
        gathers.append(out.numel()), counting(out, inp, async_op=async_op))[1])
    tokens, targets = next(batches(1))
    loss = loss_fn(model, tokens, targets)
    assert len(full_fc1) == 1 and full_fc1[0]() is None  # freed once the forward is over
    assert inner.fc1.weight is inner.fc1._parameters["weight"]  # the attribute is the shard again
    forward_gathers = len(gathers)
    loss.backward()
    model.finish_gradient_synchronization()
    assert plain.fc1.weight.numel() in gathers[forward_gathers:]  # re-gathered for backward

    loss_fn(plain, tokens, targets).backward()
    full_grads = {name: p.grad for name, p in plain.named_parameters() if p.requires_grad}
    for name, p in inner.named_parameters():
        if name in full_grads:
            assert torch.equal(p.grad, full_grads[name]), name
        else:
            assert p.grad is None and not p.requires_grad
    for name, value in model.gather_full_params().items():
        assert torch.equal(value, dict(plain.named_parameters())[name]), name


def _copy_of(model: ToyModel) -> ToyModel:
    copy = ToyModel()
    copy.load_state_dict(model.state_dict())
    return copy
