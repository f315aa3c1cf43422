"""Whether each DDP variant's training ends with the weights single-process training reaches,
on one rank's share of the batches (the CLI: `check_ddp`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from cs336_systems.distributed.training import communicate_fn, wrap_ddp
from cs336_systems.lm.adamw import AdamW
from cs336_systems.lm.loss import cross_entropy
from cs336_systems.lm.model import build_model
from cs336_systems.lm.step import random_batch

# Our data-parallel variants (torch's DDP needs no check of ours), bucketed with buckets small
# enough that the tiny model fills several.
DDP_CHECK_VARIANTS = ("naive", "flat", "overlap", "bucketed")
BUCKET_SIZE_MB = 1.0
# torch.testing.assert_close's float32 tolerances
RTOL, ATOL = 1.3e-6, 1e-5
LEARNING_RATE = 1e-3


def train(model: torch.nn.Module, batches, sync) -> None:
    optimizer = AdamW(model.parameters(), lr=LEARNING_RATE)
    for token_ids, targets in batches:
        cross_entropy(model(token_ids), targets).backward()
        sync()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def check(variant: str, config: dict, rank: int, world_size: int) -> dict:
    device = torch.device("cpu")
    size, context, batch = config["size"], config["context_length"], config["batch_size"]
    batches = [random_batch(batch, context, device, config["seed"] + step)
               for step in range(config["steps"])]
    rows = batch // world_size
    local = [(t[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
             for t, y in batches]

    torch.manual_seed(config["seed"] + rank)  # replicas start apart: the broadcast must work
    model = wrap_ddp(build_model(size, context, device=device),
                 {"variant": variant, "bucket_size_mb": BUCKET_SIZE_MB}, device)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    train(model, local, communicate_fn(model, variant))
    trained = dict(model.named_parameters())

    # how far each replica is from rank 0's
    replicas = 0.0
    for p in trained.values():
        theirs = p.detach().clone()
        dist.broadcast(theirs, src=0)
        replicas = max(replicas, (p.detach() - theirs).abs().max().item())
    spread = [None] * world_size
    dist.all_gather_object(spread, replicas)
    if rank != 0:
        return {}

    torch.manual_seed(config["seed"])  # rank 0's initial weights, on one process
    reference = build_model(size, context, device=device)
    train(reference, batches, lambda: None)
    expected = {name.removeprefix("module."): p.detach()
                for name, p in reference.named_parameters()}
    ours = {name.removeprefix("module."): p.detach() for name, p in trained.items()}
    differences = [(ours[n] - expected[n]).abs().max().item() for n in expected]
    return {
        "variant": variant,
        "max_abs_diff": max(differences),
        "equal": all(torch.equal(ours[n], expected[n]) for n in expected),
        "allclose": all(torch.allclose(ours[n], expected[n], rtol=RTOL, atol=ATOL)
                        for n in expected),
        "rtol": RTOL, "atol": ATOL,
        "replicas_max_abs_diff": max(spread),
        "moved_max_abs": max((p.detach() - initial[n]).abs().max().item()
                             for n, p in trained.items()),
    }


def work(config: dict, rank: int, world_size: int, device: torch.device) -> dict:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    checks = [check(variant, config, rank, world_size) for variant in DDP_CHECK_VARIANTS]
    return {"checks": checks, "steps": config["steps"], "learning_rate": LEARNING_RATE}
