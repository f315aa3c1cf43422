"""Decoder-only Transformer LM of the assignment's shared setup (its sizes: `lm/sizes.py`).

Pre-norm blocks: x + attn(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)); causal multi-head
self-attention with RoPE (theta 10000); final RMSNorm and an untied LM head. The attention
kernel itself is a pluggable callable (see `attention.py`), so later sections can swap in
annotated, compiled or FlashAttention versions without touching the model.
"""

from __future__ import annotations

import functools
import math

import torch
from einops import rearrange
from torch import Tensor, nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from cs336_systems.lm.attention import CUSTOM_FORWARD_OPS, AttentionFn, get_attention
from cs336_systems.lm.sizes import (  # noqa: F401 - imported from here by many modules
    MODEL_SIZES,
    VOCAB_SIZE,
    ModelSize,
    context_length_problem,
    get_size,
)

ROPE_THETA = 10_000.0


def _trunc_normal_(weight: Tensor, fan_in: int, fan_out: int) -> Tensor:
    std = math.sqrt(2.0 / (fan_in + fan_out))
    return nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-3 * std, b=3 * std)


class Linear(nn.Module):
    """y = x W^T, no bias; W is (d_out, d_in)."""

    def __init__(self, d_in: int, d_out: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in, device=device, dtype=dtype))
        _trunc_normal_(self.weight, d_in, d_out)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, d_model: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, d_model, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: Tensor) -> Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """x / rms(x) * g, computed in fp32 whatever the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x = x.float()
        rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x * rms * self.weight).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """Rotates consecutive pairs (x[2i], x[2i+1]) by angle pos * theta^(-2i/d):

        out[2i]   = x[2i] cos - x[2i+1] sin
        out[2i+1] = x[2i+1] cos + x[2i] sin

    computed as x * cos + swap(x) * sin with per-element tables (each pair's cosine twice, its
    sine signed - then +), where swap exchanges the two elements of each pair: elementwise work
    whose forward and backward compile to plain, coalesced kernels."""

    def __init__(self, d_head: int, max_seq_len: int, theta: float = ROPE_THETA, device=None):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, d_head, 2, device=device).float() / d_head)
        angles = torch.outer(torch.arange(max_seq_len, device=device).float(), inv_freq)
        sign = torch.tensor([-1.0, 1.0], device=device)
        # (max_seq, d_head): the angle of element j is the angle of pair j // 2
        self.register_buffer("cos", angles.cos().repeat_interleave(2, dim=-1), persistent=False)
        self.register_buffer("sin", (angles.sin()[..., None] * sign).flatten(-2),
                             persistent=False)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        # x: (..., seq, d_head); positions: (..., seq), broadcast against x's leading axes
        # (the attention passes (seq, 1) for x of (batch, seq, heads, d_head))
        pairs = rearrange(x, "... (half two) -> ... half two", two=2)
        swapped = rearrange(pairs.flip(-1), "... half two -> ... (half two)")
        return (x * self.cos[positions] + swapped * self.sin[positions]).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding,
                 attention: AttentionFn, device=None, dtype=None):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv_proj = Linear(d_model, 3 * d_model, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.rope = rope
        self.attention = attention

    def forward(self, x: Tensor) -> Tensor:
        # x: (batch, seq, d_model). q, k and v stay token-major in memory, (batch, seq, heads,
        # d_head), as the qkv matmul writes them and as fused attention kernels read them; the
        # kernel takes (batch, heads, seq, d_head) views of them, and its output, laid out as
        # q is, is (batch, seq, d_model) again without a transposing copy.
        seq_len = x.shape[-2]
        q, k, v = rearrange(self.qkv_proj(x), "b s (three h d) -> three b s h d",
                            three=3, h=self.num_heads)
        positions = torch.arange(seq_len, device=x.device)[:, None]  # (seq, 1): every head
        q, k = self.rope(q, positions), self.rope(k, positions)
        q, k, v = (rearrange(t, "b s h d -> b h s d") for t in (q, k, v))
        out = self.attention(q, k, v, is_causal=True)  # (batch, heads, seq, d_head)
        return self.output_proj(rearrange(out, "b h s d -> b s (h d)"))


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x)."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, rope: RotaryEmbedding,
                 attention: AttentionFn, device=None, dtype=None):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = CausalSelfAttention(d_model, num_heads, rope, attention, device, dtype)
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


def run_blocks(blocks: nn.ModuleList, x: Tensor) -> Tensor:
    for block in blocks:
        x = block(x)
    return x


# What a checkpointed group recomputes in backward: "all" keeps only the group's input;
# "elementwise" also keeps the outputs of its matmuls and attention and recomputes the cheap
# work between them (norms, RoPE, SwiGLU's gate, residual adds, casts); "all-but-attention"
# keeps attention's outputs alone (a few bytes a token beside the matmuls' outputs) and
# recomputes the matmuls too, which at long context cost less than attention to redo.
RECOMPUTE = ("all", "elementwise", "all-but-attention")
MATMUL_OPS = frozenset((torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
                        torch.ops.aten.addmm.default))
ATTENTION_OPS = frozenset((
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
))


def _is_attention(op) -> bool:
    """SDPA's fused kernels and the attention registry's custom forward operators (by name, as
    `namespace::name`: importing the kernels here would import Triton)."""
    return op in ATTENTION_OPS or op.name() in CUSTOM_FORWARD_OPS


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """recompute="elementwise": keep the matmuls' and attention's outputs."""
    if op in MATMUL_OPS or _is_attention(op):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _save_attention(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """recompute="all-but-attention": keep attention's outputs (and its logsumexp) only."""
    return CheckpointPolicy.MUST_SAVE if _is_attention(op) else CheckpointPolicy.PREFER_RECOMPUTE


_POLICIES = {"elementwise": _save_matmuls, "all-but-attention": _save_attention}


def checkpoint_options(recompute: str) -> dict:
    """The keyword arguments of `torch.utils.checkpoint.checkpoint` for `recompute`."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"unknown recompute {recompute!r}; allowed: {', '.join(RECOMPUTE)}")
    if recompute == "all":
        return {"use_reentrant": False}
    return {"use_reentrant": False, "context_fn": functools.partial(
        create_selective_checkpoint_contexts, _POLICIES[recompute])}


class TransformerLM(nn.Module):
    """With `checkpoint_block_size` k, the blocks run in groups of k (the last may be shorter),
    each group under `torch.utils.checkpoint` (non-reentrant) when gradients are on: only a
    group's input is kept for backward, and its activations are recomputed there, one group at
    a time (gradient_checkpointing, one level of recomputation). None keeps every activation.
    `recompute="elementwise"` makes the checkpointing selective (`RECOMPUTE`): the matmuls' and
    attention's outputs are kept too, and only the elementwise work between them is redone.
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int,
                 num_heads: int, d_ff: int, attention: AttentionFn | str = "eager",
                 checkpoint_block_size: int | None = None, recompute: str = "all",
                 device=None, dtype=None):
        super().__init__()
        if checkpoint_block_size is not None and checkpoint_block_size < 1:
            raise ValueError(f"checkpoint_block_size must be a positive number of blocks or "
                             f"None, got {checkpoint_block_size}")
        self.checkpoint_options = checkpoint_options(recompute)
        attention_fn = get_attention(attention) if isinstance(attention, str) else attention
        self.context_length = context_length
        self.checkpoint_block_size = checkpoint_block_size
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        # One RoPE table shared by every layer (a buffer, not a parameter).
        rope = RotaryEmbedding(d_model // num_heads, context_length, device=device)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, rope, attention_fn, device, dtype)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)

    def hidden(self, token_ids: Tensor) -> Tensor:
        """The final normed states the LM head reads: (batch, seq) -> (batch, seq, d_model)."""
        seq_len = token_ids.shape[-1]
        if seq_len > self.context_length:
            raise ValueError(f"sequence length {seq_len} exceeds the model's context length "
                             f"{self.context_length}")
        x = self.token_embeddings(token_ids)
        k = self.checkpoint_block_size
        if k is None or not torch.is_grad_enabled():
            x = run_blocks(self.layers, x)
        else:
            for start in range(0, len(self.layers), k):
                x = checkpoint(run_blocks, self.layers[start:start + k], x,
                               **self.checkpoint_options)
        return self.ln_final(x)

    def forward(self, token_ids: Tensor) -> Tensor:
        # token_ids: (batch, seq) -> logits: (batch, seq, vocab)
        return self.lm_head(self.hidden(token_ids))


def build_model(size: str, context_length: int, attention: AttentionFn | str = "eager",
                vocab_size: int = VOCAB_SIZE, checkpoint_block_size: int | None = None,
                recompute: str = "all", device=None, dtype=None) -> TransformerLM:
    """The assignment's model of a named size; `device="meta"` builds it without memory."""
    if problem := context_length_problem(size, context_length):
        raise ValueError(problem)
    spec = get_size(size)
    return TransformerLM(vocab_size, context_length, spec.d_model, spec.num_layers,
                         spec.num_heads, spec.d_ff, attention=attention,
                         checkpoint_block_size=checkpoint_block_size, recompute=recompute,
                         device=device, dtype=dtype)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def parameter_count(size: str, vocab_size: int = VOCAB_SIZE) -> int:
    """Parameters of a named size, embeddings included (built on the meta device: no memory)."""
    return count_parameters(build_model(size, context_length=get_size(size).max_context_length,
                                        vocab_size=vocab_size, device="meta"))


def forward_flops(size: str, batch_size: int, context_length: int,
                  vocab_size: int = VOCAB_SIZE) -> int:
    """Matmul FLOPs of one forward pass, 2 per multiply-add.

    Per token: the attention projections (4 d^2), the SwiGLU (3 d d_ff) in every layer and the
    LM head (d vocab); per layer and sequence: q k^T and p v over the full score matrix
    (2 seq^2 d, the causal mask's skipped half included, as an unfused kernel computes it).
    The backward pass costs about twice this.
    """
    s = get_size(size)
    tokens = batch_size * context_length
    per_token = s.num_layers * (4 * s.d_model**2 + 3 * s.d_model * s.d_ff) + s.d_model * vocab_size
    attention = s.num_layers * batch_size * 2 * context_length**2 * s.d_model
    return 2 * (tokens * per_token + attention)


def train_step_flops(spec: ModelSize, sequences: int, seq_len: int,
                     num_layers: int | None = None) -> int:
    """Model FLOPs of one training step (forward and backward) over `sequences` causal sequences
    of `seq_len` tokens, counted as the 2026 leaderboard counts them: 6 per parameter of the
    layers and the LM head per token (the embedding lookup is no matmul), plus the causal
    attention's two matmuls (2 * seq^2 * d_model per layer and sequence in the forward, the
    masked half skipped) at 3.5 times their forward (FlashAttention's backward recomputes the
    scores). `num_layers` overrides the spec's (a proxy of fewer layers)."""
    layers = spec.num_layers if num_layers is None else num_layers
    per_layer = 4 * spec.d_model**2 + 3 * spec.d_model * spec.d_ff
    dense = 6 * (layers * per_layer + spec.d_model * spec.vocab_size) * sequences * seq_len
    attention = 3.5 * layers * sequences * 2 * seq_len**2 * spec.d_model
    return int(dense + attention)
