"""Distributed training from scratch: naive and overlapped DDP, optimizer sharding, FSDP.

    naive.py              broadcast / all-reduce helpers called between backward and step
    ddp.py                DDP, DDPBucketed: all-reduces launched from gradient hooks
    sharded_optimizer.py  ShardedOptimizer: each rank keeps ~1/world of the optimizer state
    fsdp.py               FSDP: Linear and Embedding weights, their gradients and optimizer
                          state sharded; weights gathered per layer, with a prefetch window
    launch.py             spawn local process groups (tests, CPU runs) or join torchrun's
"""

from cs336_systems.distributed.ddp import DDP, DDPBucketed, assign_buckets
from cs336_systems.distributed.fsdp import FSDP
from cs336_systems.distributed.launch import (
    cleanup, free_port, require_initialized, setup_from_env, spawn,
)
from cs336_systems.distributed.naive import (
    allreduce_gradients_flat, allreduce_gradients_individually, broadcast_parameters,
)
from cs336_systems.distributed.sharded_optimizer import ShardedOptimizer

__all__ = [
    "DDP", "DDPBucketed", "FSDP", "ShardedOptimizer", "allreduce_gradients_flat",
    "allreduce_gradients_individually", "assign_buckets", "broadcast_parameters", "cleanup",
    "free_port", "require_initialized", "setup_from_env", "spawn",
]
