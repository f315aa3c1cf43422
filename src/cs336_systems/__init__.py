"""CS336 Systems: a Transformer LM, its benchmarks, kernels and distributed training.

    lm/          the model, its size table, the attention registry, loss, optimizers, one step
    kernels/     FlashAttention-2 (PyTorch, Triton), weighted_sum
    distributed/ DDP variants, FSDP, the sharded optimizer, process groups
    measure/     timing, memory, profiling, allocator timelines, saved tensors, collectives
    analysis/    models and algebra that predict what is measured
    pipeline/    config and its checks, jobs, sources, records, archive, CLI options
    report/      facts, rendering, tables, figures, coverage, the writeup
    sections/    one folder per section of the writeup (docs/architecture.md)

The names below are imported on first use, so importing a subpackage loads nothing else.
"""

from cs336_systems.lazy import lazy_exports

EXPORTS = {  # module: the names it defines
    "cs336_systems.lm.attention": ("ATTENTION_IMPLEMENTATIONS", "get_attention"),
    "cs336_systems.lm.loss": ("cross_entropy",),
    "cs336_systems.lm.model": ("MODEL_SIZES", "TransformerLM", "build_model", "parameter_count"),
    "cs336_systems.lm.adamw": ("AdamW",),
    "cs336_systems.lm.fused_adamw": ("FusedAdamW",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
