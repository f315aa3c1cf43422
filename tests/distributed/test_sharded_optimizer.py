"""ShardedOptimizer(AdamW) on 2 ranks takes exactly torch.optim.AdamW's steps, while each rank
keeps optimizer state for only its own ~half of the parameters."""

from __future__ import annotations

import copy

import pytest
import torch

from cs336_systems.distributed import ShardedOptimizer
from support.distributed import ToyModel, batches, loss_fn, run_on_ranks, save_result

STEPS = 4


def _groups(model: ToyModel):
    """(first group, group added after the first step): the fc2 layer joins late."""
    late = [model.fc2.weight, model.fc2.bias]
    first = [p for name, p in model.named_parameters() if not name.startswith("fc2.")]
    return first, late


def _sharded_worker(rank: int, world_size: int, out_dir: str) -> None:
    torch.manual_seed(0)  # the same model on every rank: this tests the optimizer alone
    model = ToyModel()
    reference = copy.deepcopy(model)
    (first, late), (ref_first, ref_late) = _groups(model), _groups(reference)
    sharded = ShardedOptimizer(first, torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    plain = torch.optim.AdamW(ref_first, lr=1e-2, weight_decay=0.1)
    for step, (tokens, targets) in enumerate(batches(STEPS)):
        if step == 1:
            sharded.add_param_group({"params": late, "lr": 2e-2})
            plain.add_param_group({"params": ref_late, "lr": 2e-2})
        if step == 2:  # as a scheduler would: the local optimizer must follow
            sharded.param_groups[0]["lr"] = plain.param_groups[0]["lr"] = 5e-3
        for m, optimizer in ((model, sharded), (reference, plain)):
            m.zero_grad()
            loss_fn(m, tokens, targets).backward()
            optimizer.step()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            # Same elementwise arithmetic, then broadcast: bitwise equal on CPU.
            torch.testing.assert_close(p, q, rtol=0, atol=0, msg=f"step {step}, {name}")

    name_of = {p: name for name, p in model.named_parameters()}
    save_result(out_dir, rank, {
        "owned": {name_of[p] for p in sharded.owned_parameters()},
        "state": {name_of[p] for p in sharded.local_optimizer.state},
        "sizes": {name: p.numel() for name, p in model.named_parameters()},
        "trainable": {name for name, p in model.named_parameters() if p.requires_grad},
        "all_in_param_groups": sum(len(g["params"]) for g in sharded.param_groups),
    })


@pytest.mark.pipeline  # starts ranks of a process group: the full test command runs it
def test_sharded_optimizer_matches_adamw_and_shards_the_state(tmp_path):
    results = run_on_ranks(_sharded_worker, tmp_path)
    sizes, trainable = results[0]["sizes"], results[0]["trainable"]
    owned = [r["owned"] for r in results]
    assert owned[0].isdisjoint(owned[1]) and owned[0] | owned[1] == sizes.keys()
    for result in results:
        assert result["all_in_param_groups"] == len(sizes)  # zero_grad reaches every parameter
        # State exists for exactly the owned parameters that train (frozen ones get no grad).
        assert result["state"] == result["owned"] & trainable
    loads = [sum(sizes[name] for name in o) for o in owned]
    assert abs(loads[0] - loads[1]) <= max(sizes.values()), loads  # about half each
