"""The training steps the section puts side by side, each defined once: which model, attention,
optimizer and compilation. Ours in every combination of attention (SDPA, our Triton FA2, our
Gluon FA2 for Hopper), optimizer (AdamW written out, fused) and compilation, and compiled into
CUDA graphs with the fused optimizer, also with the matmul weights held as bf16 copies of fp32
masters that the fused optimizer keeps (`lm.build.hold_master_weights`); the stock parts a user
would assemble instead: our model with torch's fused AdamW and SDPA's cuDNN attention (or
FlashAttention-4, a peer's package), compiled, and Hugging Face's Llama of the same shape with
torch's fused AdamW, eager and compiled; and our fastest step with FlashAttention-4 in place of
our kernel, where a stock part may beat ours.
"""

from __future__ import annotations

from dataclasses import dataclass

from cs336_systems.lm.attention import attention_label, attention_modules
from cs336_systems.lm.optimizer import optimizer_label, optimizer_modules


@dataclass(frozen=True)
class TrainingRun:
    model: str        # "ours" (cs336_systems.lm.model) or "hf-llama" (lm.hf_llama)
    attention: str    # a name of lm.attention.ATTENTION_IMPLEMENTATIONS (ours only)
    optimizer: str    # a name of lm.optimizer.OPTIMIZERS
    compile: bool
    stock: bool = False  # what a user would run instead of ours
    graphs: bool = False  # compiled with mode "reduce-overhead": graphs replayed as CUDA graphs
    master_weights: bool = False  # matmul weights as bf16 copies, fp32 masters in the optimizer

    @property
    def label(self) -> str:
        model = "HF Llama" if self.model == "hf-llama" else "ours"
        attention = "SDPA" if self.model == "hf-llama" else attention_label(self.attention)
        compiled = ", compiled, CUDA graphs" if self.graphs else ", compiled" if self.compile \
            else ""
        masters = ", bf16 weights of fp32 masters" if self.master_weights else ""
        return f"{model}, {attention}, {optimizer_label(self.optimizer)}{masters}{compiled}"

    def modules(self) -> list[str]:
        """Package modules the run imports lazily (its rule's sources)."""
        own = attention_modules(self.attention) if self.model == "ours" else []
        return own + optimizer_modules(self.optimizer)


def _ours(attention: str, optimizer: str, compile_: bool) -> TrainingRun:
    return TrainingRun("ours", attention, optimizer, compile_)


# names of lm.attention's registry, as in the run names (flash-gluon: Hopper, d 64, 80, 96 and
# 128; the Triton FA2 elsewhere)
ATTENTIONS = ("sdpa", "flash-triton", "flash-gluon")

RUNS: dict[str, TrainingRun] = {
    **{f"ours-{attention}-{o}{'-compiled' if c else ''}": _ours(attention, optimizer, c)
       for c in (False, True)
       for attention in ATTENTIONS
       for o, optimizer in (("adamw", "adamw"), ("fused", "adamw-fused"))},
    **{f"ours-{attention}-fused-graphs": TrainingRun("ours", attention, "adamw-fused", True,
                                                     graphs=True)
       for attention in ATTENTIONS},
    **{f"ours-{attention}-fused-bf16w-graphs": TrainingRun("ours", attention, "adamw-fused", True,
                                                           graphs=True, master_weights=True)
       for attention in ATTENTIONS},
    "stock-compiled": TrainingRun("ours", "sdpa-cudnn", "torch-adamw-fused", True, stock=True),
    # the peers' attention (FlashAttention-4, optional package flash-attn-4) in the stock step
    # and in our fastest one
    "stock-fa4-compiled": TrainingRun("ours", "fa4", "torch-adamw-fused", True, stock=True),
    "ours-fa4-fused-bf16w-graphs": TrainingRun("ours", "fa4", "adamw-fused", True, graphs=True,
                                               master_weights=True),
    "hf-llama": TrainingRun("hf-llama", "sdpa", "torch-adamw-fused", False, stock=True),
    "hf-llama-compiled": TrainingRun("hf-llama", "sdpa", "torch-adamw-fused", True, stock=True),
}
