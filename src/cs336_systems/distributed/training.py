"""One data-parallel training step of the LM, shared by the DDP, FSDP and correctness jobs: the
model wrapped for a variant, how its gradients are communicated, and the step's phases.

    model = wrap_ddp(build_model(...), {"variant": "bucketed", "bucket_size_mb": 100}, device)
    phases = training_phases(model, config, rank, world_size, device,
                             communicate_fn(model, "bucketed"))
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from cs336_systems.distributed.ddp import DDP, DDPBucketed
from cs336_systems.distributed.fsdp import FSDP
from cs336_systems.distributed.fully_shard import fully_shard_layers
from cs336_systems.distributed.naive import (
    allreduce_gradients_flat,
    allreduce_gradients_individually,
    broadcast_parameters,
)
from cs336_systems.distributed.variants import TRAINING_PHASES
from cs336_systems.lm.loss import cross_entropy
from cs336_systems.lm.optimizer import build_optimizer
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.lm.step import random_batch


def wrap_ddp(model: nn.Module, config: dict, device: torch.device) -> nn.Module:
    """`model` wrapped for the DDP variant `config["variant"]` (`DDP_VARIANTS`)."""
    variant = config["variant"]
    if variant == "overlap":
        return DDP(model)
    if variant == "bucketed":
        return DDPBucketed(model, config["bucket_size_mb"])
    if variant == "torch":
        device_ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    broadcast_parameters(model)
    return model


def communicate_fn(model: torch.nn.Module, variant: str):
    if variant == "naive":
        return lambda: allreduce_gradients_individually(model)
    if variant == "flat":
        return lambda: allreduce_gradients_flat(model)
    if variant in ("overlap", "bucketed"):
        return model.finish_gradient_synchronization
    return lambda: None  # torch's DDP has finished its all-reduces when backward returns


def wrap_fsdp(model: nn.Module, config: dict, device: torch.device) -> nn.Module:
    """`model` wrapped for the FSDP variant `config["variant"]` (`FSDP_VARIANTS`): ours, torch's
    `fully_shard` on each block and the root (the reference), or bucketed DDP."""
    variant, compute_dtype = config["variant"], PRECISIONS.get(config["compute_dtype"])
    if variant == "fsdp":
        return FSDP(model, compute_dtype=compute_dtype)
    if variant == "bucketed":
        return DDPBucketed(model, config["bucket_size_mb"])
    return fully_shard_layers(model, model.layers, device, compute_dtype)


def training_phases(model: torch.nn.Module, config: dict, rank: int, world_size: int,
                    device: torch.device, communicate, autocast=None) -> list:
    """The phases of one data-parallel training step of `model` (AdamW, the kind
    `config["optimizer"]` names, ours written out by default; this rank's rows of
    the batch): forward (under `autocast` if given) with the loss, backward, `communicate`, and
    the optimizer's step."""
    optimizer = build_optimizer(config.get("optimizer", "adamw"), model.parameters())
    token_ids, targets = random_batch(config["batch_size"], config["context_length"], device,
                                      config["seed"], rank, world_size)
    state = {}

    def forward():
        with autocast or nullcontext():
            state["loss"] = cross_entropy(model(token_ids), targets)

    def backward():
        state.pop("loss").backward()

    def optimizer_step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return list(zip(TRAINING_PHASES, (forward, backward, communicate, optimizer_step)))
