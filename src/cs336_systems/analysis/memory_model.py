"""An analytic model of the LM's memory: what each part of a step must hold, in bytes, derived
from the model's code (not measured). The memory sections put it beside measured peaks.

    block_residuals(MODEL_SIZES["2.7b"], batch=4, seq=2048)   # {"qkv projection": ..., ...}
    step_memory("2.7b", batch=4, seq=512, mode="train-step")  # weights, gradients, ...

`block_residuals` lists the tensors one `TransformerBlock` saves for backward with plain
PyTorch attention in fp32 (no autocast), one entry per storage, named by the operation that
made it; a storage saved by several operations counts once (RMSNorm's input is saved by x^2 and
by x * rms). The qkv projection's output is not kept: q and k are saved after RoPE, and v as the
contiguous copy that `probs @ v` makes of its head-split view. Parameters that autograd also saves are not activations and are left
out. Sizes are elements x bytes, with no allocator rounding.
"""

from __future__ import annotations

from cs336_systems.lm.model import MODEL_SIZES, VOCAB_SIZE, ModelSize, parameter_count
from cs336_systems.lm.step import MODES

FP32 = 4
BOOL = 1
INT64 = 8


def block_residuals(spec: ModelSize, batch: int, seq: int) -> dict[str, int]:
    """Bytes one block saves for backward (fp32, eager attention), by the operation whose
    output is saved: N = batch x seq tokens, d = d_model, f = d_ff, h heads of d/h."""
    n, d, f, h = batch * seq, spec.d_model, spec.d_ff, spec.num_heads
    d_head = d // h
    token = n * d * FP32       # one (batch, seq, d_model) fp32 tensor
    wide = n * f * FP32        # one (batch, seq, d_ff) fp32 tensor
    rms = n * FP32             # one RMS per token
    return {
        "block input (RMSNorm 1's x)": token,
        "RMSNorm 1: rsqrt(mean x^2)": rms,
        "RMSNorm 1: x * rms": token,
        "RMSNorm 1 output (qkv input)": token,
        "RoPE cos and sin tables, q and k": 2 * 2 * seq * d_head * FP32,
        "RoPE q (q k^T input)": token,
        "RoPE k (q k^T input)": token,
        "v, made contiguous (p @ v input)": token,
        "causal mask (~mask)": seq * seq * BOOL,
        "softmax probabilities": batch * h * seq * seq * FP32,
        "attention output, heads merged (output projection input)": token,
        "residual after attention (RMSNorm 2's x)": token,
        "RMSNorm 2: rsqrt(mean x^2)": rms,
        "RMSNorm 2: x * rms": token,
        "RMSNorm 2 output (w1, w3 input)": token,
        "w1 x": wide,
        "sigmoid(w1 x)": wide,
        "silu: w1 x * sigmoid(w1 x)": wide,
        "w3 x": wide,
        "silu(w1 x) * w3 x (w2 input)": wide,
    }


def block_parameters(spec: ModelSize) -> int:
    """Parameters of one block: qkv and output projections, SwiGLU's three, two RMSNorm gains."""
    d, f = spec.d_model, spec.d_ff
    return 4 * d * d + 3 * d * f + 2 * d


def block_gradient_bytes(spec: ModelSize, batch: int, seq: int) -> dict[str, int]:
    """What one block's backward produces (fp32): its parameters' gradients and the gradient
    of its input, which the block below receives."""
    return {"parameter gradients": block_parameters(spec) * FP32,
            "input gradient": batch * seq * spec.d_model * FP32}


def head_residuals(spec: ModelSize, batch: int, seq: int, vocab: int = VOCAB_SIZE) -> dict[str, int]:
    """What the final RMSNorm, the LM head and the loss save (fp32)."""
    n, d = batch * seq, spec.d_model
    return {"final RMSNorm input": n * d * FP32, "final RMSNorm: rsqrt(mean x^2)": n * FP32,
            "final RMSNorm: x * rms": n * d * FP32, "final RMSNorm output (LM head input)":
            n * d * FP32, "logits": n * vocab * FP32, "logsumexp": n * FP32,
            "targets (gather index)": n * INT64, "token ids (embedding index)": n * INT64}


def step_memory(size: str, batch: int, seq: int, mode: str, vocab: int = VOCAB_SIZE,
                optimizer: str = "adamw") -> dict[str, int]:
    """Bytes each kind of tensor takes during a step in `mode`, fp32 (what the analytic peak
    adds up):

    weights            every parameter, always resident
    optimizer state    AdamW's two moments (train-step; they exist from the first step on)
    gradients          one per parameter (forward-backward and train-step), at the end of backward
    saved activations  every block's residuals plus the head's, at the end of the forward
    logits             the forward's largest single output (also in inference)
    optimizer temporary  AdamW's sqrt(v) of every parameter at once (`_foreach_sqrt`): the
                       written-out `adamw` only; the fused ones (`OPTIMIZERS`) have none
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    spec = MODEL_SIZES[size]
    weights = parameter_count(size, vocab) * FP32
    out = {"weights": weights, "logits": batch * seq * vocab * FP32}
    if mode == "forward":
        return out
    saved = spec.num_layers * sum(block_residuals(spec, batch, seq).values()) + sum(
        head_residuals(spec, batch, seq, vocab).values())
    out.update({"gradients": weights, "saved activations": saved})
    if mode == "train-step":
        out["optimizer state"] = 2 * weights
        if optimizer == "adamw":
            out["optimizer temporary"] = weights
    return out


def analytic_peak(parts: dict[str, int]) -> dict[str, int | str]:
    """The larger of the two high points of a step, from `step_memory`'s parts.

    end of forward: weights, optimizer state and every saved activation (the logits among
      them), plus the logits' gradient that backward allocates first
    optimizer step: weights, gradients, optimizer state and its temporary
    inference:      weights and the logits
    """
    resident = parts["weights"] + parts.get("optimizer state", 0)
    if "saved activations" not in parts:
        return {"bytes": resident + parts["logits"], "stage": "forward"}
    stages = {"end of forward": resident + parts["saved activations"] + parts["logits"],
              "optimizer step": resident + parts["gradients"]
              + parts.get("optimizer temporary", 0)}
    stage = max(stages, key=stages.get)
    return {"bytes": stages[stage], "stage": stage}
