"""The training-step variants the leaderboard section puts side by side, each defined once.

A variant is one setting of each lever (`LEVERS`). `stock` is what a user assembles from stock
parts: SDPA on its fastest backend here (cuDNN), torch's fused AdamW, each layer compiled, full
activation checkpointing, the whole logits; `stock-hf` the same parts around Hugging Face's
Llama of the shape. Each matrix compares ours with the faster of the two. `ours` turns every
lever to this project's part; each `ours-but-...` (`Lever.without`) turns one lever off (to the
stock part, or to eager layers), so that its difference from `ours` is what that lever bought.
`plain` is the model as written (nothing compiled, nothing recomputed): the reference of the
input/output check, and the CPU smoke run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cs336_systems.lm.attention import attention_label, attention_modules
from cs336_systems.lm.loss import HEAD_LOSSES, KERNEL_MODULE
from cs336_systems.lm.optimizer import optimizer_label, optimizer_modules


@dataclass(frozen=True)
class LeaderboardVariant:
    attention: str      # a name of lm.attention.ATTENTION_IMPLEMENTATIONS
    optimizer: str      # a name of lm.optimizer.OPTIMIZERS
    compile: bool       # each layer compiled
    recompute: str      # a name of lm.levers.LAYER_RECOMPUTE
    chunked_loss: bool  # LM head and loss a chunk of tokens at a time
    stock: bool = False
    # "ours" (lm.model.TransformerLM) or "hf-llama": Hugging Face's Llama of the same shape
    # (lm.hf_llama), whose levers are its own (checkpointing, compiling; SDPA, whole logits)
    model: str = "ours"
    # with recompute "elementwise": the share of the layers (the last ones) that keep their
    # matmuls' outputs; the others recompute as `others` says (lm.levers.apply_layer_levers)
    selective_share: float = 1.0
    others: str = "all"
    # a stock LM head and loss in place of ours (a name of lm.loss.HEAD_LOSSES), or None
    head_loss: str | None = None

    def modules(self) -> list[str]:
        """Package modules the variant imports lazily (its rule's sources)."""
        return (attention_modules(self.attention) + optimizer_modules(self.optimizer)
                + ([KERNEL_MODULE] if self.chunked_loss else [])
                + (["cs336_systems.lm.hf_llama"] if self.model == "hf-llama" else []))


@dataclass(frozen=True)
class Lever:
    name: str         # a field of LeaderboardVariant
    label: str
    ours: object      # the field's value in `ours`
    off: object       # its value with the lever off: stock's part (stock compiles too)
    without: str      # the variant that is `ours` with this lever off

    def describe(self, value) -> str:
        if self.name == "attention":
            return attention_label(value)
        if self.name == "optimizer":
            return optimizer_label(value)
        if self.name == "recompute":
            return RECOMPUTE_LABELS[value]
        if self.name == "compile":
            return "layers compiled" if value else "eager"
        return "chunked" if value else "whole logits"


RECOMPUTE_LABELS = {"all": "full checkpointing",
                    "elementwise": "matmuls kept, elementwise work recomputed",
                    "all-but-attention": "attention's outputs kept, the rest recomputed",
                    "none": "nothing recomputed"}

LEVERS: tuple[Lever, ...] = (
    Lever("attention", "attention kernel", "flash-triton", "sdpa-cudnn", "ours-but-sdpa-cudnn"),
    Lever("optimizer", "optimizer", "adamw-fused", "torch-adamw-fused", "ours-but-torch-adamw"),
    Lever("compile", "per-layer torch.compile", True, False, "ours-but-eager"),
    Lever("recompute", "activation checkpointing", "elementwise", "all",
          "ours-but-full-recompute"),
    Lever("chunked_loss", "LM head and loss", True, False, "ours-but-whole-logits"),
)
LEVER_NAMES = tuple(lever.name for lever in LEVERS)

STOCK = LeaderboardVariant("sdpa-cudnn", "torch-adamw-fused", compile=True, recompute="all",
                       chunked_loss=False, stock=True)
OURS = LeaderboardVariant(**{lever.name: lever.ours for lever in LEVERS})
PLAIN = LeaderboardVariant("sdpa", "adamw", compile=False, recompute="none", chunked_loss=False)

VARIANTS: dict[str, LeaderboardVariant] = {
    "stock": STOCK,
    # the same stock parts around Hugging Face's Llama, as its users assemble them: the
    # library's checkpointing of each decoder layer, each layer compiled, SDPA's own dispatch
    "stock-hf": replace(STOCK, attention="sdpa", model="hf-llama"),
    "ours": OURS,
    **{lever.without: replace(OURS, **{lever.name: lever.off}) for lever in LEVERS},
    # what fits the full 34 layers on two 141 GB GPUs: keeping every layer's matmul outputs
    # does not (about 3.6 GB a layer at 32768 tokens), so every layer is checkpointed whole
    "ours-but-sdpa-cudnn-full-recompute": replace(OURS, attention="sdpa-cudnn", recompute="all"),
    # between the two: half the layers keep their matmuls' outputs (about 40 GiB more than
    # full checkpointing at the full shape, which two 141 GB GPUs have room for)
    "ours-but-sdpa-cudnn-half-selective": replace(OURS, attention="sdpa-cudnn",
                                                  selective_share=0.5),
    # the rest of the room: more layers keep their matmuls' outputs, and the others keep
    # attention's (a quarter of a GiB a layer), so that no layer redoes attention's forward
    **{f"ours-but-sdpa-cudnn-{share}-selective": replace(
        OURS, attention="sdpa-cudnn", selective_share=share / 100, others="all-but-attention")
       for share in (60, 70, 80)},
    # what keeps every layer's matmul outputs at the full shape: the layers' AdamW moments (8
    # bytes a parameter, 26 GiB on each of two GPUs) wait in host memory between steps and
    # each layer is stepped in backward (lm/offloaded_adamw.py), which leaves the room to the
    # activations
    "ours-offloaded": replace(OURS, optimizer="adamw-offloaded"),
    "ours-but-sdpa-cudnn-offloaded": replace(OURS, attention="sdpa-cudnn",
                                             optimizer="adamw-offloaded"),
    # what fits two 80 GB GPUs (H100s): the moments on the host, and of the activations only
    # the layers' inputs (full checkpointing), or also attention's outputs (a quarter of a GiB
    # a layer; no layer redoes attention's forward), or also the matmuls' outputs of the last
    # 10% or 20% of the layers (about 2 GiB a layer more)
    "ours-but-sdpa-cudnn-offloaded-full-recompute": replace(
        OURS, attention="sdpa-cudnn", optimizer="adamw-offloaded", recompute="all"),
    "ours-but-sdpa-cudnn-offloaded-attention-kept": replace(
        OURS, attention="sdpa-cudnn", optimizer="adamw-offloaded", recompute="all-but-attention"),
    **{f"ours-but-sdpa-cudnn-offloaded-{share}-selective": replace(
        OURS, attention="sdpa-cudnn", optimizer="adamw-offloaded", selective_share=share / 100,
        others="all-but-attention")
       for share in (10, 20)},
    # FlashAttention-4 (optional package flash-attn-4) in place of the attention kernel, in the
    # stock step and in ours: the stock kernels that beat cuDNN at long sequences on Hopper
    "stock-fa4": replace(STOCK, attention="fa4"),
    "ours-but-fa4": replace(OURS, attention="fa4"),
    "ours-but-fa4-offloaded": replace(OURS, attention="fa4", optimizer="adamw-offloaded"),
    # our Gluon kernels for Hopper (kernels/flash_gluon/) in place of the Triton FA2
    "ours-but-flash-gluon": replace(OURS, attention="flash-gluon"),
    "ours-but-flash-gluon-offloaded": replace(OURS, attention="flash-gluon",
                                              optimizer="adamw-offloaded"),
    # the one-GPU proxy's room (ours-but-fa4 peaks about 26 GiB under the stock step): the first
    # layers keep every activation, elementwise ones too, so that their backward recomputes
    # nothing (about 3 GiB a layer more at 32768 tokens); with FlashAttention-4 or our Gluon
    # kernels, so that the two differ in the attention kernel alone
    **{f"ours-but-{attention}-{share}-selective-others-kept": replace(
        OURS, attention=attention, selective_share=share / 100, others="none")
       for attention in ("fa4", "flash-gluon") for share in (60, 70)},
    # Liger Kernel's fused linear cross-entropy (optional package liger-kernel) for ours
    "ours-but-liger-loss": replace(OURS, chunked_loss=False, head_loss="liger"),
    "plain": PLAIN,
}


# how the prose names each stock step
STOCK_NAMES = {"stock": "the stock parts", "stock-hf": "Hugging Face's Llama with the stock parts",
               "stock-fa4": "the stock parts with FlashAttention-4"}


def variant_label(name: str) -> str:
    """A variant's name in tables: what it changes from `ours` or `stock`."""
    if name in ("stock", "stock-hf", "stock-fa4", "ours", "plain"):
        return {"stock": "stock parts", "stock-hf": "stock parts, Hugging Face's Llama",
                "stock-fa4": "stock parts, FlashAttention-4",
                "ours": "ours, every lever", "plain": "the model as written"}[name]
    variant = VARIANTS.get(name)
    if variant is None:
        return name
    changed = [lever.describe(getattr(variant, lever.name)) for lever in LEVERS
               if getattr(variant, lever.name) != lever.ours
               and not (lever.name == "chunked_loss" and variant.head_loss)]
    if variant.head_loss:
        changed.append(f"LM head and loss {HEAD_LOSSES[variant.head_loss].label}")
    if variant.recompute == "elementwise" and variant.selective_share < 1:
        others = {"all": "checkpointed whole",
                  "all-but-attention": "keep attention's outputs",
                  "none": "keep every activation"}[variant.others]
        changed.append(f"matmuls kept in the last {variant.selective_share:.0%} of the layers, "
                       f"the others {others}")
    return "ours, but " + ", ".join(changed)


def lever_of(name: str) -> Lever | None:
    """The one lever in which variant `name` differs from `ours`, or None."""
    variant = VARIANTS.get(name)
    if variant is None or name in ("ours", "plain") or variant.stock \
            or (variant.selective_share, variant.others) != (OURS.selective_share, OURS.others):
        return None
    changed = [lever for lever in LEVERS if getattr(variant, lever.name) != lever.ours]
    return changed[0] if len(changed) == 1 else None
