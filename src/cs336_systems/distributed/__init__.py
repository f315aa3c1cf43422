"""Distributed training from scratch: naive and overlapped DDP, optimizer sharding, FSDP.

    naive.py              broadcast / all-reduce helpers called between backward and step
    ddp.py                DDP, DDPBucketed: all-reduces launched from gradient hooks
    sharded_optimizer.py  ShardedOptimizer: each rank keeps ~1/world of the optimizer state
    fsdp.py               FSDP: Linear and Embedding weights, their gradients and optimizer
                          state sharded; weights gathered per layer, with a prefetch window
    fully_shard.py        torch's FSDP2 applied per layer and on the root (the reference)
    training.py           one data-parallel training step: a variant's wrapper and phases
    variants.py           the names of the DDP and FSDP variants the benchmarks run
    launch.py             spawn local process groups (tests, CPU runs) or join torchrun's;
                          which backend a device takes and whether this machine can hold it

The names below are imported on first use.
"""

from cs336_systems.lazy import lazy_exports

EXPORTS = {  # module: the names it defines
    "cs336_systems.distributed.ddp": ("DDP", "DDPBucketed", "assign_buckets"),
    "cs336_systems.distributed.fsdp": ("FSDP",),
    "cs336_systems.distributed.launch": (
        "cleanup", "free_port", "require_initialized", "setup_from_env", "spawn"),
    "cs336_systems.distributed.naive": (
        "allreduce_gradients_flat", "allreduce_gradients_individually", "broadcast_parameters"),
    "cs336_systems.distributed.sharded_optimizer": ("ShardedOptimizer",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
