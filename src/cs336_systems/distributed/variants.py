"""The data-parallel training variants the DDP and FSDP benchmarks compare, by name (defined once
here: the config schema, the CLIs, the rules and the reports all read these tables)."""

DDP_VARIANTS: dict[str, str] = {
    "naive": "one all-reduce per parameter after backward",
    "flat": "one all-reduce of all gradients, flattened, after backward",
    "overlap": "DDP: an async all-reduce per parameter, launched from its gradient hook",
    "bucketed": "DDPBucketed(bucket_size_mb): an async all-reduce per bucket when it is ready",
    "torch": "torch.nn.parallel.DistributedDataParallel, the reference",
}

# The FSDP benchmark (§6.2, 2026): ours, torch's FSDP2 as the reference, and bucketed DDP as the
# unsharded baseline.
FSDP_VARIANTS: dict[str, str] = {
    "fsdp": "FSDP: Linear and Embedding weights sharded, gathered per layer with prefetch",
    "fsdp2": "torch.distributed.fsdp.fully_shard on each block and the root, the reference",
    "bucketed": DDP_VARIANTS["bucketed"],
}

# The phases of one data-parallel training step, in order (`training.training_phases`):
# `communicate` is the all-reduces of the naive variants, and the exposed wait of the
# overlapped ones.
TRAINING_PHASES = ("forward", "backward", "communicate", "optimizer")
