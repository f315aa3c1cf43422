"""Where one forward+backward of attention spends its GPU time, kernel by kernel, for each
variant of `kernel_variants` at one shape, in one process (the `flash_kernels` job, whose CLI is
`kernel_profile`).

Each variant runs its eager forward+backward twice to warm up, then `steps` times inside a
torch.profiler capture, within a `record_function` range named after it and one per step
(`measure.profiling.kernel_table` gives each kernel's device time by range): each kernel's
device milliseconds in each step, so that a table can show the spread from step to step.

For each of our kernels (the Triton FA2's and the Gluon ones) the record also keeps what its
compiled binary asks of a multiprocessor (warps, registers a thread, spilled registers, shared
memory) and how many of its programs fit on one at once (`kernel_variants.occupancy`).

Then each variant runs its steps back to back for `sustain_s` seconds, after an idle gap, while
`measure.gpu_state` samples the GPU's clock and power (`sustained`): the profiled steps, each
followed by a synchronisation, run in bursts that a board under its power cap can take at a
higher clock than it holds through a sustained run, and a kernel that does more work a step
spends more energy, which under the cap is time. The forward alone runs the same way after the
forward+backward (`SUSTAINED_PASSES`): the speed targets time it back to back.

Before any of it, the job measures its own ceiling: the TFLOP/s of a large bf16 matrix product
(`measure.ceilings`), against which a kernel's executed rate says how far its tensor cores are
from theirs. A GPU-only job: on a CPU it records `skipped`.
"""

from __future__ import annotations

import time

import torch

from cs336_systems.lm.attention import get_attention, unavailable_reason
from cs336_systems.lm.precision import PRECISIONS
from cs336_systems.measure.ceilings import matmul_tflops
from cs336_systems.measure.gpu_state import GpuSampler
from cs336_systems.measure.profiling import capture, kernel_table, trace_events
from cs336_systems.measure.timing import synchronize
from cs336_systems.pipeline.records import Skip
from cs336_systems.sections.flash.kernel_variants import (
    GLUON_KERNELS,
    MATMULS,
    NEEDED,
    SUSTAINED_PASSES,
    VARIANTS,
    kernel_pass,
    occupancy,
    unit_flops,
)
from cs336_systems.sections.flash.latency import attention_inputs

WARMUP = 2
# before each variant's sustained run, seconds of idle in which the board's power falls back
IDLE_S = 2.0
# steps between the sustained run's synchronisations (its clock is read after each batch)
SUSTAINED_BATCH = 10


def binaries() -> dict[str, dict]:
    """What each of our compiled kernels asks of a multiprocessor (the Triton FA2's and the
    Gluon ones), by kernel name: the binaries of this process's direct launches
    (`kernels.launch`), one per signature, the last one compiled of each name (one shape
    here)."""
    from triton.runtime import driver

    from cs336_systems.kernels import flash_gluon, flash_triton
    from cs336_systems.kernels.launch import direct

    properties = driver.active.utils.get_device_properties(torch.cuda.current_device())

    def asks(binary) -> dict:
        warps, shared = binary.metadata.num_warps, binary.metadata.shared
        return {"warps": warps, "registers": binary.n_regs, "spills": binary.n_spills,
                "shared_kib": shared / 1024,
                **occupancy(binary.n_regs, warps, shared, properties["max_num_regs"],
                            properties["max_shared_mem"])}
    out = {}
    for kernel in (flash_triton.flash_fwd_kernel, flash_triton.flash_bwd_kernel,
                   flash_triton.flash_bwd_dq_kernel, flash_triton.flash_bwd_prepare_kernel):
        for binary, constants in direct(kernel).binaries.values():
            atomic = dict(zip(kernel.arg_names[-len(constants):], constants)).get("ATOMIC_DQ")
            out[kernel.__name__ + ("[atomic dQ]" if atomic else "")] = asks(binary)
    for kernel in gluon_kernels(flash_gluon):
        for binary, _ in direct(kernel).binaries.values():
            out[kernel.__name__] = asks(binary)
    return out


def gluon_kernels(flash_gluon) -> list:
    """The Gluon kernel functions that GLUON_KERNELS names, from the package's KERNEL_FUNCTIONS
    (a function runs under several names of its KERNELS)."""
    by_name = {fn.__name__: fn for fn in flash_gluon.KERNEL_FUNCTIONS.values()}
    return [by_name[name] for names in GLUON_KERNELS.values() for name in names]


def _attend(attention: str, atomic: bool):
    """The variant's attention: the registry's, or our kernel with dQ by atomic adds."""
    if not atomic:
        return get_attention(attention)
    from cs336_systems.kernels.flash_triton import DEFAULT_FP32_PRECISION, FlashAttentionTriton
    return lambda q, k, v, causal: FlashAttentionTriton.apply(q, k, v, causal,
                                                              DEFAULT_FP32_PRECISION, True)


def profile_variants(shape, dtype: torch.dtype, causal: bool, steps: int,
                     device: torch.device) -> tuple[list[dict], list[dict], dict]:
    """(kernels, variants, runs): each kernel's time per step by variant, each variant's status,
    and for each variant that ran its steps by pass of SUSTAINED_PASSES (its forward+backward,
    the profiled one, and its forward alone)."""
    q, k, v, grad_o = attention_inputs(shape, dtype, device)
    runs, variants = {}, []
    for variant, (attention, atomic) in VARIANTS.items():
        if reason := unavailable_reason(attention, q, k, v, causal):
            variants.append({"variant": variant, "status": "skipped", "message": reason})
            continue
        attend = _attend(attention, atomic)

        def step(attend=attend):  # gradients returned, not added into .grad
            torch.autograd.grad(attend(q, k, v, causal), (q, k, v), grad_o)

        def forward(attend=attend):
            attend(q, k, v, causal)
        for _ in range(WARMUP):
            step()
        runs[variant] = dict(zip(SUSTAINED_PASSES, (step, forward)))
        variants.append({"variant": variant, "status": "ok"})
    synchronize(device)
    step_names = [f"step {i}" for i in range(steps)]
    with capture(device) as prof:
        for variant, steps_by_pass in runs.items():
            with torch.profiler.record_function(variant):
                for name in step_names:
                    with torch.profiler.record_function(name):
                        steps_by_pass[SUSTAINED_PASSES[0]]()
                        synchronize(device)
    events = trace_events(prof)
    rows = [row for row in kernel_table(events, {"variant": list(runs), "step": step_names})
            if row["variant"] and row["step"]]
    return rows, variants, runs


def sustained(runs: dict, seconds: float, device: torch.device) -> list[dict]:
    """Each variant's steps of each pass (`runs`: variant -> pass -> step) back to back for
    `seconds` (in batches of SUSTAINED_BATCH, whole batches), after IDLE_S of idle, pass by pass
    (SUSTAINED_PASSES): its wall milliseconds a step, and the GPU's clock and power over the run
    (`GpuSampler`; where nvidia-smi cannot sample, the reason in `gpu_state`)."""
    out = []
    for pass_name, variant in ((p, v) for p in SUSTAINED_PASSES for v in runs):
        step = runs[variant][pass_name]
        time.sleep(IDLE_S)
        steps = 0
        with GpuSampler(device) as sampler:
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                for _ in range(SUSTAINED_BATCH):
                    step()
                synchronize(device)
                steps += SUSTAINED_BATCH
            elapsed = time.perf_counter() - start
        out.append({"variant": variant, "pass": pass_name, "steps": steps,
                    "ms": elapsed / steps * 1e3,
                    **sampler.metrics(), **({"gpu_state": sampler.reason} if sampler.reason
                                            else {})})
    return out


def measure(config: dict, device: torch.device) -> dict:
    if device.type != "cuda":
        raise Skip("a profile of GPU kernels; this job runs on the CPU")
    shape, dtype, causal, steps = (tuple(config["shape"]), PRECISIONS[config["precision"]],
                                   config["causal"], config["steps"])
    torch.manual_seed(config["seed"])
    ceiling = matmul_tflops(device)
    rows, variants, runs = profile_variants(shape, dtype, causal, steps, device)
    runs_sustained = sustained(runs, config["sustain_s"], device)
    kernels = {}  # (variant, kernel) -> its entry, with its device ms in each step
    for row in rows:
        variant, kernel = row["variant"], row["kernel"]
        if (variant, kernel) not in kernels:
            units = MATMULS[variant].get(kernel, 0) if variant in MATMULS else None
            kernels[variant, kernel] = {"variant": variant, "kernel": kernel,
                                        "pass": kernel_pass(kernel), "calls": 0,
                                        "step_ms": [0.0] * steps, "matmul_units": units}
        entry = kernels[variant, kernel]
        entry["calls"] += row["calls"]
        entry["step_ms"][int(row["step"].split()[-1])] += row["us"] / 1e3
    return {"kernels": list(kernels.values()), "variants": variants, "binaries": binaries(),
            "sustained": runs_sustained, "unit_tflop": unit_flops(shape, causal) / 1e12,
            "needed_units": NEEDED, "matmul_tflops": ceiling}
