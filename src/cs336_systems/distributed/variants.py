"""The data-parallel training variants the DDP benchmark compares, by name (defined once here:
the config schema, the CLI, the rules and the report all read this table)."""

DDP_VARIANTS: dict[str, str] = {
    "naive": "one all-reduce per parameter after backward",
    "flat": "one all-reduce of all gradients, flattened, after backward",
    "overlap": "DDP: an async all-reduce per parameter, launched from its gradient hook",
    "bucketed": "DDPBucketed(bucket_size_mb): an async all-reduce per bucket when it is ready",
    "torch": "torch.nn.parallel.DistributedDataParallel, the reference",
}
