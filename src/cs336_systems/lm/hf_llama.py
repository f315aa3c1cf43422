"""The stock model a user would reach for instead of ours: Hugging Face's Llama with our model's
shape (pre-norm RMSNorm blocks, SwiGLU, RoPE, untied embeddings, the same vocabulary), SDPA
attention. `transformers` is not a dependency of this project: where it is not importable,
`unavailable_reason` says so and the job records the run as skipped.
"""

from __future__ import annotations

import importlib.util

from torch import Tensor, nn

from cs336_systems.lm.model import ROPE_THETA, VOCAB_SIZE, get_size


def unavailable_reason() -> str | None:
    if importlib.util.find_spec("transformers") is None:
        return "Hugging Face transformers is not installed here (it is not a dependency)"
    return None


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
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = get_size(size)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=spec.d_model,
                         intermediate_size=spec.d_ff, num_hidden_layers=spec.num_layers,
                         num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads,
                         max_position_embeddings=context_length, rope_theta=ROPE_THETA,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
                         mlp_bias=False, attn_implementation="sdpa")
    return LogitsOnly(LlamaForCausalLM(config).to(device))
