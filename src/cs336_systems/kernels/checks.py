"""Input checks shared by the kernels: each failure says what is supported."""

from __future__ import annotations

import os

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256  # the widest head whose tiles the Triton kernels hold


def interpret_without_cuda() -> None:
    """On a machine without CUDA, run the Triton kernels in Triton's interpreter: a job calls
    this before anything imports triton (the variable is read when kernels are defined)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def require_triton_device(*tensors: torch.Tensor) -> None:
    """Triton kernels run on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cuda":
        return
    if device.type == "cpu" and triton_interpreting():
        return
    raise ValueError(f"the Triton kernels need CUDA tensors (or CPU tensors with "
                     f"TRITON_INTERPRET=1 set before triton is imported); got {device}")


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           heads: bool = False) -> None:
    """q (batch, n_queries, d) and k, v (batch, n_keys, d), or with `heads` also
    (batch, heads, n_queries, d) and (batch, heads, n_keys, d): one dtype of bf16/fp16/fp32, one
    device, n_queries and n_keys of at least 1, d from 1 to MAX_HEAD_DIM."""
    shapes = "(batch, seq, d) or (batch, heads, seq, d)" if heads else "(batch, seq, d)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 3 and not (heads and t.ndim == 4):
            raise ValueError(f"{name} must have shape {shapes}; got {tuple(t.shape)}")
    if q.dtype not in SUPPORTED_DTYPES or len({q.dtype, k.dtype, v.dtype}) != 1:
        raise ValueError(f"q, k, v must share one dtype of float32, bfloat16, float16; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if len({q.device, k.device, v.device}) != 1:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if (k.shape != v.shape or q.ndim != k.ndim or q.shape[:-2] != k.shape[:-2]
            or q.shape[-1] != k.shape[-1]):
        raise ValueError(f"q (..., n_queries, d) and k, v (..., n_keys, d) must agree; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    for label, n in (("n_queries", q.shape[-2]), ("n_keys", k.shape[-2])):
        if n < 1:
            raise ValueError(f"{label} must be at least 1; got {n}")
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"d must be from 1 to {MAX_HEAD_DIM}; got {q.shape[-1]}")
