"""Precision names, shared by the config, the CLIs and the records: the dtype of the tensors
(the flash benchmark) or of autocast (the model's steps; fp32 means no autocast)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16,
                                      "fp16": torch.float16}


def autocast_context(device: torch.device | str, precision: str) -> AbstractContextManager:
    """Autocast to the precision's dtype, or a no-op context for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=PRECISIONS[precision])
