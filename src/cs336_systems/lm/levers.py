"""What a fast training step changes around the model, each a switch that leaves its input and
output alone: activation checkpointing inside each layer, each layer compiled, the attention
kernel, and a loss that never holds the whole logits.

    model = build_model(...)                               # or TransformerLM(...)
    apply_layer_levers(model, recompute="elementwise", compile=True)
    lm_loss = LanguageModelLoss(model, chunked=True)      # lm_loss(token_ids, targets) -> loss
    with plain(model, lm_loss):                            # the same weights, every lever off
        reference = lm_loss(token_ids, targets)

The checkpoint sits inside each layer's compiled region (torchtitan's order: checkpoint, then
compile, then shard), so that the compiler sees the selective policy and partitions the layer's
forward and backward by it. `TransformerLM`'s own `checkpoint_block_size` is the assignment's
(groups of k layers, eager); this module is the leaderboard's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from cs336_systems.lm.attention import get_attention
from cs336_systems.lm.loss import HEAD_LOSSES, cross_entropy, linear_cross_entropy
from cs336_systems.lm.model import (
    RECOMPUTE,
    CausalSelfAttention,
    TransformerLM,
    checkpoint_options,
)

# What each layer recomputes in backward: "none" keeps every activation, else `RECOMPUTE`.
LAYER_RECOMPUTE = ("none", *RECOMPUTE)


class CheckpointedLayer(nn.Module):
    """One layer whose activations are recomputed in backward as `recompute` says, while
    `enabled` (and gradients are on)."""

    def __init__(self, layer: nn.Module, recompute: str):
        super().__init__()
        self.layer = layer
        self.options = checkpoint_options(recompute)
        self.enabled = True

    def forward(self, x: Tensor) -> Tensor:
        if not (self.enabled and torch.is_grad_enabled()):
            return self.layer(x)
        return checkpoint(self.layer, x, **self.options)


def apply_layer_levers(model: TransformerLM, recompute: str = "none", compile: bool = False,
                       selective_share: float = 1.0, others: str = "all") -> TransformerLM:
    """Wrap each of `model.layers` in place: checkpointed as `recompute` says (`LAYER_RECOMPUTE`),
    then compiled (`nn.Module.compile`: one graph serves every layer of the same shape).

    With recompute "elementwise" and `selective_share` below 1, only the last
    round(share x layers) layers keep their matmuls' outputs and the others recompute as
    `others` says ("all", or "all-but-attention"): memory between the two, for a model whose
    every layer cannot keep them. The last layers are the ones backward reaches first, so their
    saved outputs go first too."""
    for name, value in (("recompute", recompute), ("others", others)):
        if value not in LAYER_RECOMPUTE:
            raise ValueError(f"unknown {name} {value!r}; allowed: {', '.join(LAYER_RECOMPUTE)}")
    if not 0.0 <= selective_share <= 1.0:
        raise ValueError(f"selective_share is a share of the layers, in [0, 1]; got "
                         f"{selective_share}")
    if model.checkpoint_block_size is not None:
        raise ValueError("the model already checkpoints groups of layers "
                         "(checkpoint_block_size); build it without")
    first_selective = len(model.layers) - round(selective_share * len(model.layers))
    for i, layer in enumerate(model.layers):
        mode = others if recompute == "elementwise" and i < first_selective else recompute
        if mode != "none":
            layer = CheckpointedLayer(layer, mode)
        if compile:
            layer.compile()
        model.layers[i] = layer
    return model


def set_attention(model: TransformerLM, name: str) -> None:
    """Every layer's attention kernel (a name of `ATTENTION_IMPLEMENTATIONS`)."""
    fn = get_attention(name)
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.attention = fn


class LanguageModelLoss(nn.Module):
    """The model and its loss as one module: (token_ids, targets) -> mean cross-entropy. With
    `chunked`, the LM head and the loss run a chunk of tokens at a time (`linear_cross_entropy`),
    so the (tokens, vocab) logits never exist whole; else the logits are made and the loss taken
    in fp32 over them, as the model is written. Being a module, it can be the root that FSDP
    shards (the head's weight is gathered around this forward)."""

    def __init__(self, model: TransformerLM, chunked: bool = False,
                 head_loss: str | None = None):
        super().__init__()
        self.model = model
        self.chunked = chunked
        self.head_loss = head_loss  # a name of lm.loss.HEAD_LOSSES in place of ours (a peer's)

    def forward(self, token_ids: Tensor, targets: Tensor) -> Tensor:
        if self.head_loss is not None:
            hidden = self.model.hidden(token_ids)
            return HEAD_LOSSES[self.head_loss].fn(hidden.reshape(-1, hidden.shape[-1]),
                                                  self.model.lm_head.weight, targets.reshape(-1))
        if not self.chunked:
            return cross_entropy(self.model(token_ids), targets)
        return linear_cross_entropy(self.model.hidden(token_ids), self.model.lm_head.weight,
                                    targets)


@contextmanager
def plain(model: TransformerLM, lm_loss: LanguageModelLoss,
          attention: str = "sdpa") -> Iterator[None]:
    """Run `lm_loss` with every lever off: no checkpointing, nothing compiled, `attention`,
    whole logits; the same parameters. Restores the levers on exit."""
    layers = [m for m in model.modules() if isinstance(m, CheckpointedLayer)]
    kernels = {m: m.attention for m in model.modules() if isinstance(m, CausalSelfAttention)}
    chunked, head_loss = lm_loss.chunked, lm_loss.head_loss
    try:
        for layer in layers:
            layer.enabled = False
        set_attention(model, attention)
        lm_loss.chunked, lm_loss.head_loss = False, None
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        for layer in layers:
            layer.enabled = True
        for module, fn in kernels.items():
            module.attention = fn
        lm_loss.chunked, lm_loss.head_loss = chunked, head_loss
