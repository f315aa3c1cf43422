"""Attention implementations the model and the benchmarks plug in: one registry, one set of names.

Every implementation has the signature `attention(q, k, v, is_causal) -> out` with q, k, v and
out of shape (..., seq, d_head): the model calls it on (batch, heads, seq, d_head), the flash
benchmark on (batch, seq, d). Register new ones (annotated, compiled, other kernels) in
`ATTENTION_IMPLEMENTATIONS`; the config schema's enums, the CLIs' choices, the report's labels
and the selective checkpointing (a custom operator's `forward_op`) all read this registry. `sdpa` is SDPA with torch's own choice of backend; `sdpa-flash` and
`sdpa-cudnn` pin one backend each; `flash-gluon` is our FlashAttention for Hopper in Gluon
(the Triton FA2 where it cannot run); `fa4` is FlashAttention-4 (the `flash-attn-4` package, CuTe
DSL kernels for Hopper and Blackwell), a peer that is not installed by default
(`unavailable_reason` says where one cannot run).
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import record_function


class AttentionFn(Protocol):
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor: ...


def eager_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, written out in plain PyTorch ops."""
    d_head = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (..., seq_q, seq_k)
    if is_causal:
        seq_q, seq_k = scores.shape[-2:]
        mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# The ranges `annotated` marks inside attention (nsys_profile (e)), in the order they run.
ATTENTION_PARTS = ("attention.scores", "attention.softmax", "attention.output")


def annotated_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """`eager_attention` with each part in a profiler range (`record_function`, which is also an
    NVTX range under `torch.autograd.profiler.emit_nvtx`): the score matmul with its scaling
    and mask, the softmax, and the final matmul."""
    scores_range, softmax_range, output_range = ATTENTION_PARTS
    with record_function(scores_range):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., seq_q, seq_k)
        if is_causal:
            seq_q, seq_k = scores.shape[-2:]
            mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
    with record_function(softmax_range):
        probabilities = torch.softmax(scores, dim=-1)
    with record_function(output_range):
        return probabilities @ v


def attention_part_flops(batch_heads: int, seq: int, d_head: int) -> dict[str, int]:
    """FLOPs of each part of `annotated_attention` for `batch_heads` (batch x heads) score
    matrices of seq x seq: 2 per multiply-add for the two matmuls; for the softmax, 5 per score
    (max, subtract, exp, sum, divide), the count the handout's FLOP comparison uses."""
    scores = batch_heads * seq * seq
    return {"attention.scores": 2 * scores * d_head, "attention.softmax": 5 * scores,
            "attention.output": 2 * scores * d_head}


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """PyTorch's fused scaled_dot_product_attention (the reference users would reach for).

    (batch, seq, d) inputs get a head axis of 1, without which SDPA cannot pick its fused
    (flash, memory-efficient, cuDNN) kernels.
    """
    if q.dim() == 3:
        return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None],
                                              is_causal=is_causal)[:, 0]
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def sdpa_choice(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> str:
    """The backend `sdpa_attention`'s default dispatch picks for these inputs on this machine,
    as SDPA names it ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")."""
    from torch.nn.attention import SDPBackend
    if q.dim() == 3:
        q, k, v = q[:, None], k[:, None], v[:, None]
    return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=is_causal)).name


def sdpa_flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """`sdpa_attention` pinned to SDPA's flash backend (FlashAttention-2 kernels in PyTorch).

    `sdpa_kernel` inside the function is traced by torch.compile (dynamo), so the pinned
    backend holds in compiled code too.
    """
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return sdpa_attention(q, k, v, is_causal)


def sdpa_cudnn_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """`sdpa_attention` pinned to SDPA's cuDNN backend (cuDNN's fused attention)."""
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return sdpa_attention(q, k, v, is_causal)


# How SDPA says that no enabled backend takes these inputs: CUDA builds, then CPU builds.
_SDPA_NO_KERNEL = ("No available kernel", "No viable backend")


def unavailable_reason(name: str, q: Tensor, k: Tensor, v: Tensor,
                       is_causal: bool = False) -> str | None:
    """Why implementation `name` cannot run these inputs on this machine, or None if it can.

    An optional package's kernel (`fa4`) says for itself; an implementation pinned to one SDPA
    backend can be unavailable too (a GPU too old, a build without the backend, a head
    dimension it does not take): SDPA says so by raising at the call, with its reasons as
    warnings just before. This runs one forward without autograd.
    """
    attention = _lookup(name)
    if attention.unavailable is not None:
        return attention.unavailable(q)
    if not attention.pinned_backend:
        return None
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        try:
            get_attention(name)(q, k, v, is_causal)
        except RuntimeError as error:
            if not any(phrase in str(error) for phrase in _SDPA_NO_KERNEL):
                raise
            reasons = [" ".join(str(w.message).split()) for w in caught]
            first_line = str(error).splitlines()[0]
            return f"{attention_label(name)} cannot run here: " + "; ".join(reasons or [first_line])
    return None


def fa4_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """FlashAttention-4 (optional package `flash-attn-4`), through the custom operators of
    `lm.fa4` (one opaque call each way under torch.compile)."""
    from cs336_systems.lm.fa4 import fa4_attention as attend
    return attend(q, k, v, is_causal)


def package_unavailable_reason(name: str, head_dim: int, dtype: torch.dtype,
                               device: torch.device) -> str | None:
    """Why implementation `name`, if it says for itself (an optional package's kernel, `fa4`),
    cannot take heads of `head_dim` in `dtype` on `device`, or None; None for every other
    implementation (before any input exists: a job's skip, from its config)."""
    attention = _lookup(name)
    if attention.unavailable is None:
        return None
    return attention.unavailable(torch.empty(0, 1, 1, head_dim, device=device, dtype=dtype))


# What FlashAttention-4 takes (its module flash_attn.cute.interface): Hopper or Blackwell, 16-bit
# inputs, head dimensions that are multiples of 8 up to 256.
FA4_CAPABILITIES = ((9, 0), (10, 0), (10, 3), (11, 0), (12, 0))
FA4_DTYPES = (torch.bfloat16, torch.float16)


def fa4_unavailable_reason(q: Tensor) -> str | None:
    """Why FlashAttention-4 cannot take `q` here (not installed, not a GPU it supports, a dtype
    or head dimension it does not take), or None."""
    try:
        import flash_attn.cute  # noqa: F401
    except ImportError as error:
        return f"FlashAttention-4 is not installed (pip install flash-attn-4): {error}"
    if q.device.type != "cuda":
        return "FlashAttention-4 runs on CUDA GPUs only"
    capability = torch.cuda.get_device_capability(q.device)
    if capability not in FA4_CAPABILITIES:
        return (f"FlashAttention-4 needs a Hopper or Blackwell GPU (sm90, sm100), not "
                f"sm{capability[0]}{capability[1]}")
    if q.dtype not in FA4_DTYPES:
        return f"FlashAttention-4 takes bf16 or fp16 inputs, not {q.dtype}"
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        return ("FlashAttention-4 takes head dimensions that are multiples of 8 up to 256, "
                f"not {q.shape[-1]}")
    return None


FLASH_TRITON = "cs336_systems.kernels.flash_triton"


def _per_head(kernel, q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    """Run a (batch, seq, d) kernel over (..., seq, d) inputs by folding the leading dims."""
    lead = q.shape[:-2]
    fold = lambda t: t.reshape(-1, *t.shape[-2:])  # noqa: E731
    return kernel.apply(fold(q), fold(k), fold(v), is_causal).reshape(*lead, *q.shape[-2:])


def flash_triton_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """FlashAttention-2, Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1). They take
    (batch, heads, seq, d) views as they are, so heads are not folded (which would copy)."""
    from cs336_systems.kernels.flash_triton import (
        FlashAttentionTriton,  # triton only when used
    )
    if q.dim() in (3, 4):
        return FlashAttentionTriton.apply(q, k, v, is_causal)
    return _per_head(FlashAttentionTriton, q, k, v, is_causal)


def flash_triton_ieee_attention(q: Tensor, k: Tensor, v: Tensor,
                                is_causal: bool = False) -> Tensor:
    """`flash_triton_attention` with fp32 inputs' dots in full fp32 ("ieee", on the FMA units),
    forward and backward, rather than the kernels' default precision; 16-bit inputs as there."""
    from cs336_systems.kernels.flash_triton import FlashAttentionTriton
    return FlashAttentionTriton.apply(q, k, v, is_causal, "ieee")


def flash_gluon_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """FlashAttention-2 for Hopper in Gluon (`kernels.flash_gluon`: TMA loads and wgmma written
    out), on (batch, heads, seq, d) inputs or (batch, seq, d) ones as one head. Where its
    kernels cannot take the inputs (a head dimension other than 64, 80, 96 or 128, fp32, a GPU
    other than Hopper, the CPU), the Triton FA2 runs them, the reason logged once. One head runs as
    it comes, with no dim added and removed (the kernels see (rows, d) either way): no select's
    zero-fill and copy in the backward, no autograd nodes for views."""
    from cs336_systems.kernels.flash_gluon import FlashAttentionGluon, unsupported_reason
    reason = unsupported_reason(q, k, v)
    if reason:
        _log_fallback_once(f"flash-gluon runs the Triton FA2 here: {reason}")
        return flash_triton_attention(q, k, v, is_causal)
    return FlashAttentionGluon.apply(q, k, v, is_causal)


@functools.cache
def _log_fallback_once(message: str) -> None:
    logging.getLogger(__name__).warning(message)


def flash_pytorch_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """FlashAttention-2, tiled PyTorch forward and compiled PyTorch backward."""
    from cs336_systems.kernels.flash_pytorch import FlashAttentionPytorch
    return _per_head(FlashAttentionPytorch, q, k, v, is_causal)


@dataclass(frozen=True)
class Attention:
    """One registered implementation: the callable, its label in tables, and the kernel modules
    it imports lazily (which a Snakemake rule running it must list as sources)."""

    fn: Callable[..., Tensor]
    label: str
    kernel_modules: tuple[str, ...] = ()
    pinned_backend: bool = False  # one SDPA backend only: may not run on every machine
    # an optional package's kernel: why it cannot take q here, or None
    unavailable: Callable[[Tensor], str | None] | None = None
    # a custom operator's forward ("namespace::name"), whose outputs selective checkpointing
    # keeps as it keeps SDPA's (lm.model's policies)
    forward_op: str | None = None


ATTENTION_IMPLEMENTATIONS: dict[str, Attention] = {
    "eager": Attention(eager_attention, "plain PyTorch"),
    "annotated": Attention(annotated_attention, "plain PyTorch, profiler ranges"),
    "sdpa": Attention(sdpa_attention, "torch SDPA"),
    "sdpa-flash": Attention(sdpa_flash_attention, "SDPA flash", pinned_backend=True),
    "sdpa-cudnn": Attention(sdpa_cudnn_attention, "SDPA cuDNN", pinned_backend=True),
    "flash-triton": Attention(flash_triton_attention, "Triton FA2", (FLASH_TRITON,),
                              forward_op="cs336::flash_attn_fwd"),
    "flash-triton-ieee": Attention(flash_triton_ieee_attention, "Triton FA2, fp32 in IEEE",
                                   (FLASH_TRITON,), forward_op="cs336::flash_attn_fwd"),
    "flash-gluon": Attention(flash_gluon_attention, "Gluon FA2 (sm90)",
                             ("cs336_systems.kernels.flash_gluon", FLASH_TRITON),
                             forward_op="cs336::flash_gluon_fwd"),
    "flash-pytorch": Attention(flash_pytorch_attention, "PyTorch FA2 (tiled)",
                               ("cs336_systems.kernels.flash_pytorch",)),
    "fa4": Attention(fa4_attention, "FlashAttention-4", ("cs336_systems.lm.fa4",),
                     unavailable=fa4_unavailable_reason, forward_op="cs336::fa4_fwd"),
}
# the forward operators of the registry's custom kernels
CUSTOM_FORWARD_OPS = frozenset(a.forward_op for a in ATTENTION_IMPLEMENTATIONS.values()
                               if a.forward_op)


def _lookup(name: str) -> Attention:
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"unknown attention {name!r}; allowed: "
                         f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return ATTENTION_IMPLEMENTATIONS[name]


def get_attention(name: str) -> AttentionFn:
    return _lookup(name).fn


def attention_label(name: str) -> str:
    """The implementation's name in tables and figures (the name itself if unregistered)."""
    return ATTENTION_IMPLEMENTATIONS[name].label if name in ATTENTION_IMPLEMENTATIONS else name


def attention_modules(name: str) -> list[str]:
    """Package modules a job running `name` imports lazily, for its rule's source inputs."""
    return list(_lookup(name).kernel_modules)
