"""torch's FSDP2 as its users apply it: `fully_shard` on each layer, then on the root. The
reference of the FSDP benchmark and the leaderboard's sharding; no import of this project's
DDP or FSDP, so that editing those does not redo the jobs that only use torch's."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def fully_shard_layers(root: nn.Module, layers: nn.ModuleList, device: torch.device,
                       compute_dtype: torch.dtype | None = None) -> nn.Module:
    """`fully_shard` on each of `layers`, then on `root` (what is left: embeddings, final norm,
    head), over every rank of the default group; parameters gathered in `compute_dtype`
    (None: their own), gradients reduced in fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    return fully_shard(root, mesh=mesh, mp_policy=policy)
