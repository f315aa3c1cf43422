"""Cross-entropy written out: mean over positions of logsumexp(logits) - logits[target]."""

from __future__ import annotations

from torch import Tensor


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    # logits: (..., vocab), targets: (...) int64; computed in fp32 for stability under autocast.
    logits = logits.float()
    target_logits = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (logits.logsumexp(dim=-1) - target_logits).mean()
