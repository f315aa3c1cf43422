"""The stock model a user would reach for instead of ours: Hugging Face's Llama with our model's
shape (pre-norm RMSNorm blocks, SwiGLU, RoPE, untied embeddings, the same vocabulary), SDPA
attention. `transformers` is not a dependency of this project: where it is not importable,
`unavailable_reason` says so and the job records the run as skipped.

    model = build_hf_llama("2.7b", context_length=512)          # token ids -> logits
    lm_loss = HFLanguageModelLoss(llama_of(spec, 32768))         # (ids, targets) -> loss
    stock_layer_levers(lm_loss, recompute=True, compile=True)    # HF's checkpointing, compiled
    with hf_plain(lm_loss):                                      # both off, the same weights
        reference = lm_loss(ids, targets)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from cs336_systems.lm.loss import cross_entropy
from cs336_systems.lm.model import ROPE_THETA, VOCAB_SIZE, get_size
from cs336_systems.lm.sizes import ModelSize


def unavailable_reason() -> str | None:
    if importlib.util.find_spec("transformers") is None:
        return "Hugging Face transformers is not installed here (it is not a dependency)"
    return None


def llama_of(spec: ModelSize, context_length: int, layers: int | None = None,
             vocab_size: int | None = None, device=None) -> nn.Module:
    """`LlamaForCausalLM` of `spec`'s shape (`layers` of them, default the shape's), fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size or spec.vocab_size, hidden_size=spec.d_model,
                         intermediate_size=spec.d_ff,
                         num_hidden_layers=layers or spec.num_layers,
                         num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads,
                         max_position_embeddings=context_length, rope_theta=ROPE_THETA,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
                         mlp_bias=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config).to(device)


class LogitsOnly(nn.Module):
    """A causal LM of `transformers` called as ours is: token ids in, logits out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, token_ids: Tensor) -> Tensor:
        return self.model(input_ids=token_ids, use_cache=False).logits


def build_hf_llama(size: str, context_length: int, device=None,
                   vocab_size: int = VOCAB_SIZE) -> nn.Module:
    """`LlamaForCausalLM` of our size `size`, fp32 weights, wrapped to return logits."""
    return LogitsOnly(llama_of(get_size(size), context_length, vocab_size=vocab_size,
                               device=device))


class HFLanguageModelLoss(nn.Module):
    """Hugging Face's Llama and its loss as one module: (token_ids, targets) -> the mean
    cross-entropy over the whole logits, taken in fp32 (as `lm.levers.LanguageModelLoss` does
    with ours unchunked). Being a module, it can be the root that FSDP shards."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.model.layers

    def forward(self, token_ids: Tensor, targets: Tensor) -> Tensor:
        return cross_entropy(self.model(input_ids=token_ids, use_cache=False).logits, targets)


# HF's activation checkpointing as its docs advise it, non-reentrant
CHECKPOINTING = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}


def stock_layer_levers(lm_loss: HFLanguageModelLoss, recompute: bool, compile: bool) -> None:
    """The stock levers as Hugging Face's users set them: the library's own activation
    checkpointing of every decoder layer (non-reentrant), each layer compiled inside it."""
    if recompute:
        lm_loss.model.gradient_checkpointing_enable(**CHECKPOINTING)
    if compile:
        for layer in lm_loss.layers:
            layer.compile()


@contextmanager
def hf_plain(lm_loss: HFLanguageModelLoss) -> Iterator[None]:
    """Run `lm_loss` with its levers off (no checkpointing, nothing compiled), the same
    parameters; restores them on exit."""
    model = lm_loss.model
    checkpointing = model.is_gradient_checkpointing
    try:
        if checkpointing:
            model.gradient_checkpointing_disable()
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        if checkpointing:
            model.gradient_checkpointing_enable(**CHECKPOINTING)
