"""What eager attention holds in memory (pytorch_attention, 3.1): the bytes of its tensors in the
forward and the backward, by what they are, for the attention section's accounting beside the
measured peaks."""

from __future__ import annotations


def eager_attention_bytes(batch: int, seq: int, d: int, dtype_bytes: int = 4) -> dict:
    """Bytes of the tensors of `eager_attention` (softmax(q k^T / sqrt(d)) v, no mask) and its
    backward, by what they are. A (seq x seq) matrix per batch element is `scores`; a
    (seq x d) one is `vector`.

    - inputs: q, k, v, and the gradient of the output fed to backward
    - forward: the scaled scores and the softmax output P live together (the unscaled product
      is freed once divided); the output
    - saved for backward: q, k (for q k^T), P (softmax saves its output, P v saves P) and v
    - backward: dP = dO v^T beside the saved P; softmax's backward then holds dP * P (a
      temporary) and dS = P (dP - sum(dP * P)) at once; dq, dk, dv
    """
    scores = batch * seq * seq * dtype_bytes
    vector = batch * seq * d * dtype_bytes
    parts = {
        "inputs": 4 * vector,
        "scores": scores,
        "softmax_output": scores,
        "output": vector,
        "saved_for_backward": 3 * vector + scores,
        "gradients": 3 * vector + 2 * scores,
    }
    parts["before_backward"] = parts["inputs"] + parts["output"] + parts["softmax_output"]
    parts["forward_peak"] = parts["inputs"] + parts["scores"] + parts["softmax_output"] + vector
    # P, dP, the temporary dP * P and dS live together inside softmax's backward
    parts["backward_peak"] = (parts["inputs"] + parts["softmax_output"] + parts["gradients"]
                              + scores)
    parts["peak"] = max(parts["forward_peak"], parts["backward_peak"])
    return parts
