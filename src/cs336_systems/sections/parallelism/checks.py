"""The checks behind section 7's formulas: ring collectives simulated against their cost model,
FLOP counts and tensor-parallel backward against plain matrix products (the CLI:
`check_parallelism`)."""

from __future__ import annotations

import numpy as np
import torch

from cs336_systems.analysis import parallelism as par
from cs336_systems.analysis import ring_collectives as ring

COLLECTIVES = ("ring reduce-scatter", "ring all-gather", "ring all-reduce",
               "alternate all-reduce")


def _ring_inputs(n: int, chunk_elements: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One tensor per device of whole numbers in float64, so every sum is exact."""
    return [rng.integers(-100, 100, n * chunk_elements).astype(np.float64) for _ in range(n)]


def _simulate(name: str, tensors: list[np.ndarray]) -> tuple[float, ring.Sent]:
    """Run one collective; returns the largest error of any device's result, and the sends."""
    n, total = len(tensors), np.sum(tensors, axis=0)
    if name == "ring reduce-scatter":
        chunks, sent = ring.simulate_reduce_scatter([np.array_split(t, n) for t in tensors])
        expected = np.array_split(total, n)
        error = max(np.abs(chunks[i][(i + 1) % n] - expected[(i + 1) % n]).max()
                    for i in range(n))
        return float(error), sent
    if name == "ring all-gather":
        # device i starts with chunk (i+1) mod n of the total, as a reduce-scatter leaves it
        expected = np.array_split(total, n)
        start = [[expected[c] if c == (i + 1) % n else np.zeros_like(expected[c])
                  for c in range(n)] for i in range(n)]
        gathered, sent = ring.simulate_all_gather(start)
        results = [np.concatenate(device) for device in gathered]
    elif name == "ring all-reduce":
        results, sent = ring.simulate_ring_all_reduce(tensors)
    else:
        results, sent = ring.simulate_alternate_all_reduce(tensors)
    return float(max(np.abs(r - total).max() for r in results)), sent


def _formula_time(name: str):
    return {"ring reduce-scatter": par.reduce_scatter_time, "ring all-gather": par.all_gather_time,
            "ring all-reduce": par.all_reduce_time,
            "alternate all-reduce": par.alternate_all_reduce_time}[name](par.S, par.N)


def collective_checks(ring_devices: list[int], chunk_elements: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for n in ring_devices:
        tensors = _ring_inputs(n, chunk_elements, rng)
        size = tensors[0].nbytes                                      # S
        for name in COLLECTIVES:
            error, sent = _simulate(name, tensors)
            rows.append({
                "collective": name, "devices": n, "bytes": size, "steps": len(sent),
                "bytes_sent_per_device": max(sum(step[i] for step in sent) for i in range(n)),
                # in units of S / W: the time at W = 1 byte/s over S
                "simulated_time_s_per_w": ring.simulated_time(sent, 1.0) / size,
                "formula_time_s_per_w": par.value(_formula_time(name), {par.S: 1, par.N: n,
                                                                        par.W: 1}),
                "max_abs_error": error})
    return rows


def flop_checks(batch: int, d_model: int, d_ff: int, devices: list[int]) -> list[dict]:
    """Each strategy's per-device FLOPs (sympy) against FlopCounterMode on that device's share:
    data parallel and FSDP B/N rows; tensor parallel F/N columns; the 2D grid (N_TP = N_FSDP = n)
    B/n rows and F/n columns, forward only (the question's)."""
    rows = []
    shapes = {par.B: batch, par.D: d_model, par.F: d_ff}

    def add(strategy, n, pass_name, flops_expr, counted, extra=None):
        rows.append({"strategy": strategy, "devices": n, "pass": pass_name,
                     "counted": int(counted),
                     "formula": int(round(par.value(flops_expr, {**shapes, **(extra or {})})))})

    whole = par.ffn_equations()
    counted = par.counted_flops(batch, d_model, d_ff)
    add("whole FFN", 1, "forward", par.equations_flops(whole.forward), counted[0])
    add("whole FFN", 1, "backward", par.equations_flops(whole.backward), counted[1])
    strategies = {"data parallel": par.data_parallel(), "FSDP": par.fsdp(),
                  "tensor parallel": par.tensor_parallel()}
    grid = par.fsdp_tp()
    for n in devices:
        if batch % n or d_ff % n:
            raise ValueError(f"batch {batch} and d_ff {d_ff} must split evenly over {n} devices")
        for name, passes in strategies.items():
            share = ((batch, d_model, d_ff // n) if name == "tensor parallel"
                     else (batch // n, d_model, d_ff))
            counted = par.counted_flops(*share)
            for i, pass_name in enumerate(("forward", "backward")):
                add(name, n, pass_name, passes[pass_name].flops, counted[i], {par.N: n})
        counted = par.counted_flops(batch // n, d_model, d_ff // n)
        add(f"FSDP x TP ({n} x {n})", n * n, "forward", grid.flops, counted[0],
            {par.N_TP: n, par.N_FSDP: n})
    return rows


def tp_backward_checks(batch: int, d_model: int, d_ff: int, devices: list[int]) -> list[dict]:
    """The largest difference between the tensor-parallel equations' Y and gradients and
    autograd's on the unsharded FFN, float64, per device count."""
    rows = []
    for n in devices:
        tensors = par.ffn_tensors(batch, d_model, d_ff)
        sharded = par.tensor_parallel_gradients(tensors, n)
        reference = par.autograd_gradients(tensors)
        rows.append({"devices": n,
                     **{f"{k}_max_abs_error": float((sharded[k] - reference[k]).abs().max())
                        for k in reference},
                     "max_abs_value": float(max(v.abs().max() for v in reference.values()))})
    return rows


def measure(config: dict) -> dict:
    torch.manual_seed(0)
    ffn = (config["batch"], config["d_model"], config["d_ff"])
    return {"collectives": collective_checks(config["ring_devices"], config["chunk_elements"]),
            "flops": flop_checks(*ffn, config["devices"]),
            "tp_backward": tp_backward_checks(*ffn, config["devices"])}
