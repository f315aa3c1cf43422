"""CS336 Systems: a Transformer LM, its benchmarks, kernels and distributed training."""

from cs336_systems.attention import ATTENTION_IMPLEMENTATIONS, get_attention
from cs336_systems.loss import cross_entropy
from cs336_systems.model import MODEL_SIZES, TransformerLM, build_model, parameter_count
from cs336_systems.optimizer import AdamW

__all__ = [
    "ATTENTION_IMPLEMENTATIONS", "AdamW", "MODEL_SIZES", "TransformerLM", "build_model",
    "cross_entropy", "get_attention", "parameter_count",
]
