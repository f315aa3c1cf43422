"""Where one forward+backward of attention spends its GPU time, kernel by kernel: our
FlashAttention-2 (its deterministic backward, and the variant that adds dQ atomically) beside
SDPA's cuDNN and flash backends, at one shape, in one process.

    python -m cs336_systems.sections.flash.kernel_profile --shape 16x16384x128 --dtype bf16 \
        --output r.json

Each variant runs its eager forward+backward twice to warm up, then `--steps` times inside a
torch.profiler capture, within a `record_function` range named after it and one per step
(`measure.profiling.kernel_table` gives each kernel's device time by range): each kernel's
device milliseconds in each step, so that a table can show the spread from step to step. A
kernel's pass is `forward` or `backward` by its name (`kernel_pass`).

Work is counted in matmul units: one (seq x seq x d) product per head, halved under the causal
mask (2 * batch * seq^2 * d * 0.5 FLOPs). The forward needs 2 (Q K^T, P V), the backward 5 (Q K^T,
dO V^T, dV, dK, dQ). Our kernels' own counts (`OUR_MATMULS`) say what each executes: the
deterministic backward recomputes Q K^T and dO V^T in its dQ kernel, 7 in all. SDPA's kernels
get the units their pass needs, since how they split them is not ours to know. So each pass has
a needed rate (needed units over its time) and each of our kernels an executed one.

For each of our Triton kernels the record also keeps what its compiled binary asks of a
multiprocessor (warps, registers a thread, spilled registers, shared memory) and how many of
its programs fit on one at once, the occupancy limit that registers or shared memory set.
A GPU-only job: on a CPU it records `skipped`.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.lm.attention import (
    attention_label,
    get_attention,
    unavailable_reason,
)
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.measure.profiling import capture, kernel_table, trace_events
from cs336_systems.measure.timing import synchronize
from cs336_systems.pipeline.cli import add_common_arguments, positive_int
from cs336_systems.pipeline.records import Skip, run_and_record
from cs336_systems.sections.flash.time_flash import attention_inputs
from cs336_systems.sections.flash.time_targets import parse_shape

# variant -> (attention implementation, dQ by atomic adds)
VARIANTS = {"flash-triton": ("flash-triton", False),
            "flash-triton-atomic-dq": ("flash-triton", True),
            "sdpa-cudnn": ("sdpa-cudnn", False),
            "sdpa-flash": ("sdpa-flash", False)}
NEEDED = {"forward": 2, "backward": 5}  # matmul units each pass needs
# matmul units each of our kernels executes per forward+backward: see kernels/flash_triton.py
OUR_MATMULS = {"flash_fwd_kernel": 2, "flash_bwd_dq_kernel": 3, "flash_bwd_prepare_kernel": 0,
               "flash_bwd_kernel": 4}
OUR_MATMULS_ATOMIC = {**OUR_MATMULS, "flash_bwd_kernel": 5}  # it adds dS K into dQ too
WARMUP = 2


def variant_label(variant: str) -> str:
    attention, atomic = VARIANTS[variant]
    return attention_label(attention) + (", dQ by atomic adds" if atomic else "")


def kernel_pass(kernel: str) -> str:
    """`forward` for a forward kernel by its name (ours `flash_fwd_kernel`, cuDNN's `...fprop...`,
    SDPA flash's `flash_fwd_kernel<...>`), else `backward`."""
    return "forward" if ("fwd" in kernel or "fprop" in kernel) else "backward"


def unit_flops(shape: tuple[int, int, int], causal: bool) -> float:
    batch, seq, d = shape
    return 2.0 * batch * seq * seq * d * (0.5 if causal else 1.0)


def binaries() -> dict[str, dict]:
    """What each of our compiled Triton kernels asks of a multiprocessor, by kernel name: the
    binaries of this process's direct launches (`kernels.launch`), one per signature, the last
    one compiled of each name (one shape here)."""
    from triton.runtime import driver

    from cs336_systems.kernels import flash_triton
    from cs336_systems.kernels.launch import direct

    properties = driver.active.utils.get_device_properties(torch.cuda.current_device())
    out = {}
    for kernel in (flash_triton.flash_fwd_kernel, flash_triton.flash_bwd_kernel,
                   flash_triton.flash_bwd_dq_kernel, flash_triton.flash_bwd_prepare_kernel):
        for binary, constants in direct(kernel).binaries.values():
            warps, shared = binary.metadata.num_warps, binary.metadata.shared
            atomic = dict(zip(kernel.arg_names[-len(constants):], constants)).get("ATOMIC_DQ")
            name = kernel.__name__ + ("[atomic dQ]" if atomic else "")
            out[name] = {"warps": warps, "registers": binary.n_regs, "spills": binary.n_spills,
                         "shared_kib": shared / 1024,
                         **occupancy(binary.n_regs, warps, shared, properties["max_num_regs"],
                                     properties["max_shared_mem"])}
    return out


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


def profile_variants(shape, dtype: torch.dtype, causal: bool, steps: int,
                     device: torch.device) -> tuple[list[dict], list[dict]]:
    """(kernels, variants): each kernel's time per step by variant, and each variant's status."""
    from cs336_systems.kernels import flash_triton
    q, k, v, grad_o = inputs = attention_inputs(shape, dtype, device)
    runs, variants = {}, []
    for variant, (attention, atomic) in VARIANTS.items():
        if reason := unavailable_reason(attention, q, k, v, causal):
            variants.append({"variant": variant, "status": "skipped", "message": reason})
            continue
        attend = get_attention(attention)

        def step(attend=attend, atomic=atomic):
            with flash_triton.dq_by_atomic_adds(atomic):  # gradients returned, not added into .grad
                torch.autograd.grad(attend(q, k, v, causal), (q, k, v), grad_o)
        for _ in range(WARMUP):
            step()
        runs[variant] = step
        variants.append({"variant": variant, "status": "ok"})
    synchronize(device)
    step_names = [f"step {i}" for i in range(steps)]
    with capture(device) as prof:
        for variant, step in runs.items():
            with torch.profiler.record_function(variant):
                for name in step_names:
                    with torch.profiler.record_function(name):
                        step()
                        synchronize(device)
    del inputs
    events = trace_events(prof)
    rows = [row for row in kernel_table(events, {"variant": list(runs), "step": step_names})
            if row["variant"] and row["step"]]
    return rows, variants


def measure(config: dict, device: torch.device) -> dict:
    if device.type != "cuda":
        raise Skip("a profile of GPU kernels; this job runs on the CPU")
    shape, dtype, causal, steps = (tuple(config["shape"]), PRECISIONS[config["dtype"]],
                                   config["causal"], config["steps"])
    torch.manual_seed(config["seed"])
    rows, variants = profile_variants(shape, dtype, causal, steps, device)
    kernels = {}  # (variant, kernel) -> its entry, with its device ms in each step
    for row in rows:
        variant, kernel = row["variant"], row["kernel"]
        if (variant, kernel) not in kernels:
            atomic = VARIANTS[variant][1]
            units = (OUR_MATMULS_ATOMIC if atomic else OUR_MATMULS).get(kernel, 0) \
                if variant.startswith("flash-triton") else None
            kernels[variant, kernel] = {"variant": variant, "kernel": kernel,
                                        "pass": kernel_pass(kernel), "calls": 0,
                                        "step_ms": [0.0] * steps, "matmul_units": units}
        entry = kernels[variant, kernel]
        entry["calls"] += row["calls"]
        entry["step_ms"][int(row["step"].split()[-1])] += row["us"] / 1e3
    return {"kernels": list(kernels.values()), "variants": variants, "binaries": binaries(),
            "unit_tflop": unit_flops(shape, causal) / 1e12, "needed_units": NEEDED}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, type=parse_shape, help="BATCHxSEQxD")
    parser.add_argument("--dtype", required=True, choices=list(PRECISIONS))
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--steps", type=positive_int, default=5,
                        help="profiled forward+backward steps per variant")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    config = {k: v for k, v in vars(args).items() if k not in ("output", "device")}
    config["shape"] = list(args.shape)
    return run_and_record("flash_kernels", config, args.output,
                          lambda device: measure(config, device), args.device)


if __name__ == "__main__":
    main()
