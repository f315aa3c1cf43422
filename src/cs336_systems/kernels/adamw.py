"""AdamW in one Triton pass over many tensors: the kernel under `lm.fused_adamw.FusedAdamW`,
the update of `lm.adamw.AdamW` with no temporaries, one launch per `Plan`.

Each element is read once (p, g, m, v) and written once (p, m, v): 28 bytes for fp32 state and
gradients, 24 with bf16 gradients, which is the floor of the step's memory traffic. The update,
in fp32 whatever the gradients' dtype (lines as in `AdamW`'s docstring):

    p <- p * (1 - lr * weight_decay)                                   (decoupled decay)
    m <- m + (1 - beta1) * (g - m)                                     (beta1 m + (1-beta1) g)
    v <- beta2 * v + (1 - beta2) * g^2
    p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

One launch covers many tensors, as torch's multi-tensor apply does: the tensors of one kind
(parameters, gradients, moments) are addressed by element offsets from the first of them, and
each program takes one chunk of CHUNK elements of one tensor (a table of (tensor, first
element) per chunk). Offsets are multiples of 4 elements, so loads and stores are 16 bytes
wide; a tensor that is not 16-byte aligned is refused by `check_fusable`. The tables of the
parameters and moments (`Plan`) are built once and kept on the device; each step sends only
the gradients' offsets, so a step costs the host a loop over the parameters and one launch.

With working copies (a Plan's `copies`), the same pass writes each parameter's bf16 copy from
its updated fp32 value (2 bytes more per element).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cs336_systems.kernels.checks import require_triton_device

# The launch shape, the fastest of scripts/sweep_adamw.py's on the 2.7b's parameters (its
# timings: docs/measurements.md, "The fused AdamW's launch shape").
CHUNK = 65536   # elements a program updates: a few per SM on the largest weights
BLOCK = 4096    # elements per load, 8 per thread with 16 warps
WARPS = 16
ALIGN = 16      # bytes: every tensor's start, so that offsets are multiples of 4 elements


@triton.jit
def _rounded(x, dtype: tl.constexpr):
    """fp32 `x` rounded to the nearest `dtype` value, ties to even, as torch's `.to(dtype)`
    rounds (finite values). bf16 is done with integer operations: the same on a GPU and in the
    interpreter, whose bf16 cast truncates."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, idx, end,
                 decay, beta2, one_minus_beta1, one_minus_beta2, step_size, bias2_sqrt, eps,
                 MASKED: tl.constexpr, COPY: tl.constexpr):
    """Elements `idx` of one tensor, in place; masked at `end` only in a chunk's last block,
    so that every other block's loads and stores stay 16 bytes wide. With COPY, the updated
    p is also written to its working copy `w_ptr` in that copy's dtype."""
    mask = idx < end if MASKED else None
    p = tl.load(p_ptr + idx, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + idx, mask=mask).to(tl.float32)
    m = tl.load(m_ptr + idx, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + idx, mask=mask).to(tl.float32)
    p = p * decay                                             # line 1
    m = m + one_minus_beta1 * (g - m)                         # line 2
    v = beta2 * v + one_minus_beta2 * g * g                   # line 3
    # line 4, with IEEE sqrt and division (Triton's defaults are approximate)
    p = p - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(v), bias2_sqrt) + eps)
    tl.store(p_ptr + idx, p.to(p_ptr.dtype.element_ty), mask=mask)
    tl.store(m_ptr + idx, m.to(m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + idx, v.to(v_ptr.dtype.element_ty), mask=mask)
    if COPY:
        tl.store(w_ptr + idx, _rounded(p, w_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adamw_chunk(p_base, g_base, m_base, v_base, w_base,     # the first tensor of each kind
                 p_off, g_off, m_off, v_off, w_off,          # [tensors] offsets from the bases
                 numels, chunk_tensor, chunk_start,          # [tensors] sizes; [chunks] table
                 decay, beta2, one_minus_beta1, one_minus_beta2, step_size, bias2_sqrt, eps,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr, COPY: tl.constexpr):
    """One chunk of one tensor (program = chunk): `decay` = 1 - lr * weight_decay, `step_size`
    = lr / (1 - beta1^t), `bias2_sqrt` = sqrt(1 - beta2^t), and 1 - beta computed on the host
    in double precision (in fp32 from fp32's 0.999, 1 - beta2 is off by 1.3e-5 of itself).
    Without COPY, `w_base` and `w_off` are placeholders, never read."""
    chunk = tl.program_id(0)
    tensor = tl.load(chunk_tensor + chunk)
    start = tl.multiple_of(tl.load(chunk_start + chunk), CHUNK)
    end = tl.minimum(start + CHUNK, tl.load(numels + tensor))
    full_end = start + (end - start) // BLOCK * BLOCK         # CHUNK is a multiple of BLOCK
    p_ptr = p_base + tl.multiple_of(tl.load(p_off + tensor), 4)
    g_ptr = g_base + tl.multiple_of(tl.load(g_off + tensor), 4)
    m_ptr = m_base + tl.multiple_of(tl.load(m_off + tensor), 4)
    v_ptr = v_base + tl.multiple_of(tl.load(v_off + tensor), 4)
    w_ptr = w_base
    if COPY:
        w_ptr = w_base + tl.multiple_of(tl.load(w_off + tensor), 4)
    for first in range(start, full_end, BLOCK):
        _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, first + tl.arange(0, BLOCK), end,
                     decay, beta2, one_minus_beta1, one_minus_beta2, step_size, bias2_sqrt, eps,
                     MASKED=False, COPY=COPY)
    if full_end < end:  # the tensor's last chunk, when its size is no multiple of BLOCK
        _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, full_end + tl.arange(0, BLOCK), end,
                     decay, beta2, one_minus_beta1, one_minus_beta2, step_size, bias2_sqrt, eps,
                     MASKED=True, COPY=COPY)


def check_fusable(*tensors: torch.Tensor) -> None:
    """The kernel's needs: contiguous tensors on one Triton device, each 16-byte aligned."""
    require_triton_device(*tensors)
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"FusedAdamW needs contiguous tensors; got one of shape "
                             f"{tuple(t.shape)} with strides {t.stride()}")
        if t.data_ptr() % ALIGN:
            raise ValueError(f"FusedAdamW needs {ALIGN}-byte aligned tensors; got one at "
                             f"{t.data_ptr():#x} (a view into another tensor?)")


def _offsets(tensors: list[torch.Tensor]) -> list[int]:
    base, size = tensors[0].data_ptr(), tensors[0].element_size()
    return [(t.data_ptr() - base) // size for t in tensors]


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 table on `device`, copied without waiting for the device where it can be."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


@dataclass
class Plan:
    """What one launch keeps between steps: its parameters and moments (one dtype each, one
    device), the parameters' working copies where they have them, and on the device their
    offsets, sizes and chunk table."""

    params: list[torch.Tensor]
    exp_avgs: list[torch.Tensor]
    exp_avg_sqs: list[torch.Tensor]
    copies: list[torch.Tensor] | None = None  # written from params after each update
    chunk: int = CHUNK

    def __post_init__(self):
        copies = self.copies or []
        check_fusable(*self.params, *self.exp_avgs, *self.exp_avg_sqs, *copies)
        if len({t.dtype for t in self.params}) != 1 or len({t.dtype for t in copies}) > 1:
            raise ValueError("one launch takes one parameter dtype and one copy dtype")
        if copies and [c.shape for c in copies] != [p.shape for p in self.params]:
            raise ValueError("each working copy must have its parameter's shape")
        numels = [p.numel() for p in self.params]
        chunks = [(i, start) for i, n in enumerate(numels) for start in range(0, n, self.chunk)]
        kinds = [self.params, self.exp_avgs, self.exp_avg_sqs, *([copies] if copies else [])]
        table = _to_device([o for tensors in kinds for o in _offsets(tensors)] + numels
                           + [i for i, _ in chunks] + [start for _, start in chunks],
                           self.params[0].device)
        n, k = len(self.params), len(kinds)
        self.p_off, self.m_off, self.v_off, *w_off = table[:k * n].view(k, n)
        self.w_off = w_off[0] if w_off else self.p_off  # a placeholder without copies
        self.numels = table[k * n:(k + 1) * n]
        self.chunk_tensor, self.chunk_start = table[(k + 1) * n:].view(2, len(chunks))
        self.key = self.describe(self.params, self.exp_avgs, self.exp_avg_sqs, copies)

    @staticmethod
    def describe(*tensor_lists) -> tuple:
        """What makes a plan stale: the tensors' addresses and sizes."""
        return tuple((t.data_ptr(), t.numel()) for tensors in tensor_lists for t in tensors)

    def step(self, grads: list[torch.Tensor], *, step: int, lr: float, beta1: float,
             beta2: float, eps: float, weight_decay: float, block: int = BLOCK,
             num_warps: int = WARPS) -> None:
        """One AdamW step of the plan's tensors with `grads` (one dtype), in place, one launch."""
        if self.chunk % block:
            raise ValueError(f"the block ({block} elements) must divide the chunk "
                             f"({self.chunk})")
        for g, p in zip(grads, self.params):
            if not g.is_contiguous() or g.data_ptr() % ALIGN or g.device != p.device:
                check_fusable(g, p)
        if len({g.dtype for g in grads}) != 1:
            raise ValueError("one launch takes one gradient dtype")
        g_off = _to_device(_offsets(grads), grads[0].device)
        copies = self.copies or self.params  # without copies: a placeholder, never written
        _adamw_chunk[(self.chunk_tensor.numel(),)](
            self.params[0], grads[0], self.exp_avgs[0], self.exp_avg_sqs[0], copies[0],
            self.p_off, g_off, self.m_off, self.v_off, self.w_off, self.numels,
            self.chunk_tensor, self.chunk_start,
            1.0 - lr * weight_decay, beta2, 1.0 - beta1, 1.0 - beta2, lr / (1 - beta1**step),
            math.sqrt(1 - beta2**step), eps, CHUNK=self.chunk, BLOCK=block,
            COPY=bool(self.copies), num_warps=num_warps)


def adamw_step(params: list[torch.Tensor], grads: list[torch.Tensor],
               exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor], *, step: int,
               lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One AdamW step of every (p, g, m, v), in place, in one launch (a plan used once)."""
    Plan(params, exp_avgs, exp_avg_sqs).step(grads, step=step, lr=lr, beta1=beta1, beta2=beta2,
                                            eps=eps, weight_decay=weight_decay)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor (a DTensor, as FSDP2 makes parameters), else `t`:
    AdamW is elementwise, so each rank steps its own shard."""
    return t.to_local() if hasattr(t, "to_local") else t
