"""The kernel profile's vocabulary (`kernel_profile` measures, `kernel_table` reads): the
variants, each kernel's pass, the matmul units each pass needs and each of our kernels executes,
and how many programs of a kernel fit on a multiprocessor.

Work is counted in matmul units: one (seq x seq x d) product per head, halved under the causal
mask (2 * batch * seq^2 * d * 0.5 FLOPs). The forward needs 2 (Q K^T, P V), the backward 5 (Q K^T,
dO V^T, dV, dK, dQ). Our kernels' own counts (`OUR_MATMULS`) say what each executes: the
deterministic backward recomputes Q K^T and dO V^T in its dQ kernel, 7 in all, and so does the
Gluon split one's (the default at d 128); the Gluon specialized one (d 64) executes the 5.
SDPA's kernels get the units their pass needs, since how they split them is not ours to know. So each pass has
a needed rate (needed units over its time) and each of our kernels an executed one.
"""

from __future__ import annotations

from cs336_systems.lm.attention import attention_label, attention_modules

# variant -> (attention implementation, dQ by atomic adds)
VARIANTS = {"flash-triton": ("flash-triton", False),
            "flash-triton-atomic-dq": ("flash-triton", True),
            "flash-gluon": ("flash-gluon", False),
            "sdpa-cudnn": ("sdpa-cudnn", False),
            "sdpa-flash": ("sdpa-flash", False),
            "fa4": ("fa4", False)}  # FlashAttention-4, where installed
NEEDED = {"forward": 2, "backward": 5}  # matmul units each pass needs
# what the profile's sustained runs run (`kernel_timings.sustained`), in order: a variant's
# forward+backward, then its forward alone (what the speed targets of the forward time)
SUSTAINED_PASSES = ("forward+backward", "forward")
# matmul units each of our kernels executes per forward+backward: see kernels/flash_triton.py
OUR_MATMULS = {"flash_fwd_kernel": 2, "flash_bwd_dq_kernel": 3, "flash_bwd_prepare_kernel": 0,
               "flash_bwd_kernel": 4}
OUR_MATMULS_ATOMIC = {**OUR_MATMULS, "flash_bwd_kernel": 5}  # it adds dS K into dQ too
# the Gluon kernels (kernels/flash_gluon/) by pass: a forward kernel a schedule (the waited and
# overlapped schedules share one; the head dim picks the default), and the kernels of the
# default backward schedules (the head dim picks): the split one's two, the specialized one's
GLUON_KERNELS = {"forward": ("attention_fwd_kernel", "attention_fwd_specialized_kernel",
                             "attention_fwd_pingpong_kernel"),
                 "backward": ("attention_dq_kernel", "attention_dkdv_kernel",
                              "attention_delta_kernel", "attention_dkdv_specialized_kernel")}
# ... and their matmul units: the split dQ kernel recomputes S and dP, as ours does; the
# specialized key-tile kernel does the five once
GLUON_MATMULS = {**dict.fromkeys(GLUON_KERNELS["forward"], 2), "attention_dq_kernel": 3,
                 "attention_dkdv_kernel": 4, "attention_delta_kernel": 0,
                 "attention_dkdv_specialized_kernel": 5}
# variant -> the matmul units each of its kernels executes (the variants whose kernels are ours)
MATMULS = {"flash-triton": OUR_MATMULS, "flash-triton-atomic-dq": OUR_MATMULS_ATOMIC,
           "flash-gluon": GLUON_MATMULS}


def variant_label(variant: str) -> str:
    attention, atomic = VARIANTS[variant]
    return attention_label(attention) + (", dQ by atomic adds" if atomic else "")


def variant_modules() -> list[str]:
    """The kernel modules the variants import lazily (the profile job's sources)."""
    return sorted({m for attention, _ in VARIANTS.values() for m in attention_modules(attention)})


def kernel_pass(kernel: str) -> str:
    """`forward` for a forward kernel by its name (ours `flash_fwd_kernel` and
    `attention_fwd_kernel`, cuDNN's `...fprop...`, SDPA flash's `flash_fwd_kernel<...>`), else
    `backward`."""
    return "forward" if ("fwd" in kernel or "fprop" in kernel) else "backward"


def unit_flops(shape: tuple[int, int, int], causal: bool) -> float:
    batch, seq, d = shape
    return 2.0 * batch * seq * seq * d * (0.5 if causal else 1.0)


def occupancy(registers: int, warps: int, shared: int, max_registers: int, max_shared: int
              ) -> dict:
    """How many programs of a kernel fit on one multiprocessor at once, and what limits it:
    its registers (`registers` a thread, 32 threads a warp) against the multiprocessor's
    `max_registers`, its shared memory (bytes) against `max_shared` (allocation granularity
    left out)."""
    by_registers = max_registers // max(1, registers * 32 * warps)
    by_shared = max_shared // shared if shared else by_registers
    limited_by = ("registers" if by_registers < by_shared else
                  "shared memory" if by_shared < by_registers else "registers and shared memory")
    return {"programs_per_sm": min(by_registers, by_shared), "limited_by": limited_by}
